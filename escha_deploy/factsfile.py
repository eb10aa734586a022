"""The facts file: a described host as one input (``--facts FILE`` on ``plan``, ``up`` and
``serve``; ``ESCHA_FACTS`` in compose).

A versioned JSON document with three parts: ``host`` (what the kernel reports: MemTotal, the
huge-page reservation, the cgroup limit), ``findings`` (doctor's saved findings: pinned ceiling,
host allocator, NCCL smoke test) and ``gpus`` (one record per GPU, as NVML reports it). Plans
made from a facts file read nothing of the machine they run on except the model folder and
the L3 directory's free space: the same file gives the same plan on the host and inside the
container, which is what makes ``up`` and ``docker compose up`` reach the same digest.

Write one with ``escha-deploy plan --write-facts FILE`` (this host, with its fresh doctor
findings) or by hand. Bytes are ``int``.
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import (BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, StringConstraints, ValidationError,
                      field_validator)

from .findings import DoctorFindings
from .paths import FACTS_ENV  # noqa: F401  (re-exported: defined in paths, which builds no model)

if TYPE_CHECKING:
    from .doctor.gpu import GpuInventory
    from .host import HostFacts

#: The facts-file schema this escha-deploy reads and writes.
FACTS_SCHEMA_VERSION = 1
#: Where ``compose --facts FILE`` mounts the file in the container.
CONTAINER_FACTS_PATH = "/etc/escha/facts.json"
#: The largest byte count a fact may hold: the profile's cap on any size (``units.MAX_SIZE``,
#: 1 PiB), so a described host of 1e30 bytes is refused as a profile size of 1e30 is.
MAX_FACT_BYTES = 2**50
#: A GPU index as a key of ``p2p``/``topology`` (``"1"``).
GpuIndexKey = Annotated[str, StringConstraints(pattern=r"^[0-9]{1,4}$")]


# HostSection and FactsFile are defer_build (pydantic ``ConfigDict.defer_build``): ``up`` and
# ``serve`` import this module for ``GpuRecord`` (the launch spec's GPU records) and build the
# facts-file validators only when a facts file is read or written.
class HostSection(BaseModel):
    """What the server's Linux kernel reports (``/proc/meminfo``, the cgroup files). Under
    WSL2 ``mem_total_bytes`` is the VM's MemTotal, not the Windows host's RAM."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)
    platform: Literal["linux", "wsl2"]
    mem_total_bytes: StrictInt = Field(gt=0, le=MAX_FACT_BYTES, description="MemTotal (bytes)")
    hugetlb_bytes: StrictInt = Field(default=0, ge=0, le=MAX_FACT_BYTES,
                                     description="memory reserved as huge pages (bytes)")
    cgroup_limit_bytes: StrictInt | None = Field(
        default=None, gt=0, le=MAX_FACT_BYTES, description="the server's cgroup memory limit (bytes); null: none")
    host_id: str = Field(default="", description="host.host_id() of the described machine (not planned on)")


class GpuRecord(BaseModel):
    """One GPU as NVML reports it (``nvmlDeviceGetMemoryInfo``, ``nvmlDeviceGetCudaComputeCapability``,
    ``nvmlDeviceGetPciInfo``). Only ``index`` is required, so a hand-written file can list what it
    knows. The planner reads brand and P2P status (``gpu_facts.peer_access``: the launch flags
    follow them); all of it is part of the digest."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    index: StrictInt = Field(ge=0, le=4095, description="CUDA/NVML device index")
    name: str | None = Field(default=None, description="nvmlDeviceGetName, e.g. NVIDIA GeForce RTX 5060 Ti")
    uuid: str | None = Field(default=None, description="nvmlDeviceGetUUID (GPU-...)")
    pci_bus_id: str | None = Field(default=None, description="nvmlDeviceGetPciInfo busId")
    memory_total_bytes: StrictInt | None = Field(default=None, gt=0, le=MAX_FACT_BYTES,
                                           description="nvmlDeviceGetMemoryInfo total (bytes)")
    compute_capability: str | None = Field(default=None, description='major.minor, e.g. "12.0"')
    driver_version: str | None = Field(default=None, description="nvmlSystemGetDriverVersion")
    brand: str | None = Field(default=None, description="nvmlDeviceGetBrand as a word (GeForce, NVIDIA RTX, ...)")
    architecture: str | None = Field(default=None, description="nvmlDeviceGetArchitecture as a word")
    pci_device_id: int | None = Field(default=None, description="nvmlPciInfo_t.pciDeviceId (device << 16 | vendor)")
    pci_subsystem_id: int | None = Field(default=None, description="nvmlPciInfo_t.pciSubSystemId")
    p2p: dict[GpuIndexKey, str] = Field(default_factory=dict, description="other GPU index -> "
                                        "nvmlDeviceGetP2PStatus (read) as a word: ok, not supported, ...")
    topology: dict[GpuIndexKey, str] = Field(default_factory=dict, description="other GPU index -> "
                                             "nvmlDeviceGetTopologyCommonAncestor as a word")


class FactsFile(BaseModel):
    """The facts file (schema version ``FACTS_SCHEMA_VERSION``). ``escha_version`` and
    ``created_at`` say who wrote it and when; they are not facts and are not digested."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)
    schema_version: int = FACTS_SCHEMA_VERSION
    escha_version: str | None = Field(default=None, description="the escha-deploy that wrote it")
    created_at: str | None = Field(default=None, description="ISO 8601 UTC time it was written")
    host: HostSection
    findings: DoctorFindings | None = Field(default=None, description="doctor's findings for this host")
    gpus: list[GpuRecord] = Field(default_factory=list, description="one record per GPU (NVML)")

    @field_validator("gpus")
    @classmethod
    def _one_record_per_index(cls, gpus: list[GpuRecord]) -> list[GpuRecord]:
        seen: set[int] = set()
        for g in gpus:
            if g.index in seen:
                raise ValueError(f"GPU index {g.index} is listed twice; one record per GPU")
            seen.add(g.index)
        return gpus

    def digest_values(self) -> dict:
        """The fact values a plan digest covers: the host section (less its id) and the
        findings' pinned ceiling, allocator and NCCL result, and the GPU records; not who
        wrote the file or when."""
        f = self.findings
        return {
            "host": self.host.model_dump(mode="json", exclude={"host_id"}),
            "findings": None if f is None else {
                "pinned_ceiling_bytes": f.pinned_ceiling_bytes, "pinned_ceiling_reached": f.pinned_ceiling_reached,
                "host_allocator": f.host_allocator, "nccl_smoke_ok": f.nccl_smoke_ok},
            "gpus": [g.model_dump(mode="json") for g in self.gpus],
        }


def load_facts_file(path: str | Path) -> FactsFile:
    """Read and check a facts file. Raises ``BadInput`` (exit 2) naming the file and the field,
    or both schema versions when the file is of another one."""
    from .jsonio import read_json

    p = Path(path)
    return facts_file_from_data(read_json(p, "the facts file"), p)


def facts_file_from_data(data: object, p: Path) -> FactsFile:
    """``load_facts_file`` for JSON already read from ``p`` (named in the errors): a doctor
    report through ``facts_from_doctor_report``, else a facts file of this schema version."""
    from .errors import BadInput

    if not isinstance(data, dict):
        raise BadInput(f"{p}: a facts file is a JSON object")
    if is_doctor_report(data):
        return facts_from_doctor_report(data, p)
    version = data.get("schema_version")
    if type(version) is not int or version != FACTS_SCHEMA_VERSION:  # true == 1 and 1.0 == 1 in Python
        from . import __version__

        raise BadInput(f"{p}: schema_version: facts file schema version {version!r}; this escha-deploy "
                       f"{__version__} reads version {FACTS_SCHEMA_VERSION} (write one with "
                       "`escha-deploy plan --write-facts FILE`, or pass `escha-deploy doctor --format json`'s report)")
    try:
        return FactsFile.model_validate(data)
    except ValidationError as exc:
        raise BadInput(*(f"{p}: {'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in exc.errors())) from None


_FactBytes = Annotated[StrictInt, Field(ge=0, le=MAX_FACT_BYTES)]


class _View(BaseModel):
    """Base of the parts of a doctor report ``facts_from_doctor_report`` reads: strict types
    (JSON's own: an int is no string, no bool, no float), other keys ignored."""

    model_config = ConfigDict(extra="ignore", defer_build=True)


class _ReportMemory(_View):
    mem_total_bytes: Annotated[StrictInt, Field(gt=0, le=MAX_FACT_BYTES)] | None = None
    hugetlb_bytes: _FactBytes | None = None
    cgroup_limit_bytes: Annotated[StrictInt, Field(gt=0, le=MAX_FACT_BYTES)] | None = None


class _ReportPinned(_View):
    largest_bytes: _FactBytes | None = None
    reached: StrictBool | None = None


class _ReportNccl(_View):
    ok: StrictBool | None = None


class _ReportProbes(_View):
    source: StrictStr | None = None
    skipped: object = None
    unavailable: object = None
    host_allocator: Literal["register", "pinned"] | None = None
    pinned: _ReportPinned | None = None
    nccl: list[_ReportNccl] = Field(default_factory=list)


class _ReportFacts(_View):
    platform: Literal["linux", "wsl2"] | None = None
    host_id: StrictStr | None = None
    memory: _ReportMemory | None = None
    memory_error: StrictStr | None = None
    probes: _ReportProbes | None = None
    gpus: dict | None = None


class _Report(_View):
    """``doctor --format json``'s report as far as a facts file needs it."""

    created_at: StrictStr | None = None
    facts: _ReportFacts


def is_doctor_report(data: object) -> bool:
    """True for ``escha-deploy doctor --format json``'s report (``checks`` and ``facts``, no
    ``schema_version``), which ``--facts`` and ``fleet plan`` read as a facts file."""
    return (isinstance(data, dict) and "schema_version" not in data and isinstance(data.get("facts"), dict)
            and "checks" in data)


def facts_from_doctor_report(report: dict, source: str | Path = "report") -> FactsFile:
    """The facts file a saved doctor report describes: the one conversion ``plan --facts``,
    ``up``/``serve --facts`` and ``fleet plan`` share. ``host`` from ``facts.platform``,
    ``facts.memory`` (MemTotal, huge pages, cgroup limit) and ``facts.host_id``; ``findings``
    from ``facts.probes`` (pinned ceiling, allocator, NCCL smoke test) when they ran; ``gpus``
    from ``facts.gpus`` (NVML only). Readings of a moment (MemAvailable, cgroup usage) are left
    out. Raises ``BadInput`` naming the file and the missing or wrong key."""
    from .doctor.gpu import GpuInventory
    from .errors import BadInput

    if not isinstance(report, dict) or not isinstance(report.get("facts"), dict):
        raise BadInput(f"{source}: facts: missing; this is not a doctor report (`escha-deploy doctor --format json`)")
    try:
        view = _Report.model_validate(report)
    except ValidationError as exc:  # a key of the wrong type: its path, e.g. facts.memory.mem_total_bytes
        raise BadInput(*(f"{source}: {'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in exc.errors()[:5])) from None
    facts = view.facts
    memory = facts.memory or _ReportMemory()
    if not memory.mem_total_bytes:
        raise BadInput(f"{source}: facts.memory.mem_total_bytes: missing "
                       f"({facts.memory_error or 'no memory facts'})")
    probes = facts.probes or _ReportProbes()
    pinned = probes.pinned or _ReportPinned()
    # probes that could not run there (no torch: `unavailable`) are unknown, never findings
    ran = probes.source not in (None, "not run") and not probes.skipped and not probes.unavailable
    created = view.created_at or ""
    findings = None
    if ran:
        findings = DoctorFindings(
            created_at=created, host_id=facts.host_id or "", platform=facts.platform,
            host_allocator=probes.host_allocator, pinned_ceiling_bytes=pinned.largest_bytes,
            pinned_ceiling_reached=bool(pinned.reached),
            nccl_smoke_ok=probes.nccl[-1].ok if probes.nccl else None)
    try:
        inv = GpuInventory.model_validate(facts.gpus) if facts.gpus else None
    except ValidationError as exc:
        raise BadInput(*(f"{source}: facts.gpus.{'.'.join(str(x) for x in e['loc'])}: {e['msg']}"
                         for e in exc.errors()[:5])) from None
    try:
        return FactsFile(
            escha_version=None, created_at=created or None,
            host=HostSection(platform=facts.platform or "linux", mem_total_bytes=memory.mem_total_bytes,
                             hugetlb_bytes=memory.hugetlb_bytes or 0, cgroup_limit_bytes=memory.cgroup_limit_bytes,
                             host_id=facts.host_id or ""),
            findings=findings, gpus=records_from_inventory(inv))
    except ValidationError as exc:
        raise BadInput(*(f"{source}: facts.{'.'.join(str(x) for x in e['loc'])}: {e['msg']}"
                         for e in exc.errors()[:5])) from None


def facts_from_host(host: HostFacts, findings: DoctorFindings | None, gpus: list[GpuRecord] = ()) -> FactsFile:
    """A facts file describing ``host`` (live facts) with ``findings``; MemAvailable, cgroup
    usage and free disk are left out: they are readings of a moment, stale by the next start."""
    from . import __version__

    return FactsFile(
        escha_version=__version__,
        created_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        host=HostSection(platform=host.platform, mem_total_bytes=host.mem_total_bytes,
                         hugetlb_bytes=host.hugetlb_bytes, cgroup_limit_bytes=host.cgroup_limit_bytes,
                         host_id=host.host_id),
        findings=findings, gpus=list(gpus),
    )


def records_from_inventory(inv: GpuInventory | None) -> list[GpuRecord]:
    """One ``GpuRecord`` per GPU of an NVML inventory (``doctor.gpu.GpuInventory``); the pair
    facts (P2P status, topology) go on both GPUs of each pair."""
    if inv is None or inv.source != "nvml":
        return []
    out = []
    for g in inv.gpus:
        p2p, topo = {}, {}
        for pair, status in inv.p2p.items():
            i, j = (int(x) for x in pair.split("-"))
            if g.index in (i, j):
                p2p[str(j if g.index == i else i)] = status
        for pair, level in inv.topology.items():
            i, j = (int(x) for x in pair.split("-"))
            if g.index in (i, j):
                topo[str(j if g.index == i else i)] = level
        out.append(GpuRecord(index=g.index, name=g.name, uuid=g.uuid, pci_bus_id=g.pci_bus_id,
                             memory_total_bytes=g.vram_bytes, compute_capability=g.compute_capability,
                             driver_version=inv.driver_version, brand=g.brand, architecture=g.architecture,
                             pci_device_id=g.pci_device_id, pci_subsystem_id=g.pci_subsystem_id,
                             p2p=p2p, topology=topo))
    return out


def inventory_from_records(records: list[GpuRecord]) -> GpuInventory | None:
    """The NVML inventory the records describe (``None`` for no records), so a plan from a
    facts file decides peer access as a plan from NVML does."""
    from .doctor.gpu import GpuInfo, GpuInventory

    if not records:
        return None
    gpus = [GpuInfo(index=r.index, name=r.name or f"GPU {r.index}", vram_bytes=r.memory_total_bytes or 0,
                    compute_capability=r.compute_capability, brand=r.brand, architecture=r.architecture,
                    uuid=r.uuid, pci_bus_id=r.pci_bus_id, pci_device_id=r.pci_device_id,
                    pci_subsystem_id=r.pci_subsystem_id) for r in records]
    p2p, topo = {}, {}
    for r in records:
        for other, status in r.p2p.items():
            i, j = sorted((r.index, int(other)))
            p2p.setdefault(f"{i}-{j}", status)
        for other, level in r.topology.items():
            i, j = sorted((r.index, int(other)))
            topo.setdefault(f"{i}-{j}", level)
    return GpuInventory(source="nvml", driver_version=records[0].driver_version, gpus=gpus, p2p=p2p, topology=topo)
