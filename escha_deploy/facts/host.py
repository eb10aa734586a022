"""The host's memory as the planner reads it: ``HostFacts`` (pure: no I/O).

``host.gather_host_facts`` fills it from this machine (``/proc/meminfo``, the cgroup files,
doctor's saved findings, NVML); ``host.described_host`` from ``--host-ram``; a facts file through
``factsfile``. The planner takes it as an argument and never reads the machine itself.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..profile.models import MIN_PREFILL_TOKENS_PER_S, Number
from ..facts.restore_bandwidth import RestoreBandwidth
from ..utils.units import fmt_gib
from .gpus import GpuInventory

class L3DirReading(BaseModel):
    """The file L3 store's folder as read where the server runs (``folders.read_l3_dir``):
    ``statvfs`` figures as SGLang's ``LRUFileEvictor._fs_stats`` takes them (``fs_bytes``:
    ``f_blocks * f_frsize``; ``free_bytes``: ``f_bavail * f_frsize``), and the store's own files
    there (``store_bytes`` in ``store_files`` files: those the server's ranks count and evict as
    theirs, ``sglang.filestore.own_file``). Bytes."""

    model_config = ConfigDict(frozen=True)
    path: str
    mount: str
    fs_bytes: int = Field(ge=0)
    free_bytes: int = Field(ge=0)
    store_bytes: int = Field(ge=0)
    store_files: int = Field(ge=0)
    other_bytes: int = Field(0, ge=0, description="bytes of .bin files there that no rank of this server owns "
                             "(another TP size or model): SGLang never evicts them")


#: The kernel the server runs under: ``wsl2`` for Microsoft's WSL2 kernel, else ``linux``.
Platform = Literal["linux", "wsl2"]


class HostFacts(BaseModel):
    """What the planner knows about the machine the server will run on.

    ``mem_total_bytes`` is the memory the server's Linux kernel sees (MemTotal; under WSL2 the
    VM's, about half of the Windows host by default). ``mem_available_bytes`` is MemAvailable
    now (``None`` for a described host, ``--host-ram``). ``hugetlb_bytes`` is memory reserved
    for huge pages: MemTotal counts it, but an anonymous or ``cudaHostAlloc`` host pool can
    never get it (Documentation/admin-guide/mm/hugetlbpage.rst). The memory the server can
    have is MemTotal less the huge pages, or the cgroup limit when that is lower
    (``memory_base``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    source: Literal["live", "described", "facts"] = Field(
        description="live: read from this machine; described: from --host-ram (or a fleet box's "
        "host_ram); facts: from a facts file or a saved doctor report (--facts, a fleet box's facts)"
    )
    platform: Platform
    mem_total_bytes: int = Field(gt=0)
    mem_available_bytes: int | None = None
    hugetlb_bytes: int = Field(default=0, ge=0, description="memory held as huge pages (bytes)")
    cgroup_limit_bytes: int | None = None
    cgroup_usage_bytes: int | None = None
    cgroup_limit_file: str | None = Field(
        default=None, description="the cgroup file the limit was read from (memory.max, memory.limit_in_bytes)")
    in_container: bool = False
    host_id: str = ""
    pinned_ceiling_bytes: int | None = Field(
        default=None, description="doctor's measured pinned ceiling per process, if any"
    )
    pinned_ceiling_reached: bool = False
    host_allocator: Literal["register", "pinned"] | None = Field(
        default=None, description="allocator doctor's host-mapped store probe picked"
    )
    restore_bandwidth: RestoreBandwidth | None = Field(
        default=None, description="doctor's restore-bandwidth probe (host <-> device GB/s), for host_hit_cost")
    nccl_env: dict[str, str] = Field(
        default_factory=dict, description="the NCCL environment doctor's all-reduce smoke test passed with "
        "(findings.nccl_env; empty: not run, failed, or passed with NCCL's defaults); the planner renders it")
    prefill_tokens_per_s: Number | None = Field(
        default=None, ge=MIN_PREFILL_TOKENS_PER_S, le=1e9,
        description="`bench`'s last cold prefill on this box (tokens/s), for host_hit_cost")
    prefill_source: str | None = Field(default=None, description="where prefill_tokens_per_s came from")
    prefill_model: str | None = Field(
        default=None, description="the model that prefill was measured on: the server's served model name, as "
        "`bench` recorded it; the planner uses the rate only for a profile serving that model")
    l3_checked: bool = Field(
        default=False, description="the L3 directory was checked here (exists, writable, cap free: "
        "folders.check_l3_dir); false when the plan describes another host")
    l3_dir: L3DirReading | None = Field(
        default=None, description="the file L3 folder's filesystem and the store's own files, read where the "
        "server runs; None: not read (another host, or no folder to read)")
    gpus: GpuInventory | None = Field(
        default=None, description="the GPUs as NVML reports them (brand, PCI ids, P2P status, topology); "
        "None: not read (a described host, or no NVML here)")
    origin: str | None = Field(
        default=None, exclude=True,
        description="where a described or saved host's numbers were written, when not the command line: "
        "e.g. `fleet.yaml:12 boxes.lin-b.host_ram`; named in memory_base's source (not serialized)")

    @property
    def memory_base_bytes(self) -> int:
        """The memory the server can have (bytes): see ``memory_base``."""
        return self.memory_base()[0]

    def memory_base(self) -> tuple[int, str, Literal["ram", "cgroup"]]:
        """``(bytes, source, kind)``: MemTotal less the huge-page reservation, or the cgroup
        limit when that is lower. ``source`` names the numbers and the files they came from;
        ``kind`` is ``ram`` or ``cgroup``."""
        ram = max(self.mem_total_bytes - self.hugetlb_bytes, 0)
        where = self.origin or {"live": "/proc/meminfo", "facts": "facts file"}.get(self.source, "--host-ram")
        ram_src = f"MemTotal {fmt_gib(self.mem_total_bytes)} ({where})"
        if self.hugetlb_bytes:
            ram_src = (f"MemTotal {fmt_gib(self.mem_total_bytes)} - {fmt_gib(self.hugetlb_bytes)} of huge pages "
                       "(/proc/meminfo Hugetlb, HugePages_Total x Hugepagesize)")
        if self.cgroup_limit_bytes is not None and self.cgroup_limit_bytes < ram:
            # the figure always, and where it came from: the cgroup file read, or the facts file's
            # host.cgroup_limit_bytes (a described limit has no file)
            origin = self.cgroup_limit_file or self.origin or {
                "facts": "facts file host.cgroup_limit_bytes", "live": "the server's cgroup"}.get(self.source, self.source)
            src = f"cgroup memory limit {fmt_gib(self.cgroup_limit_bytes)} ({origin})"
            return self.cgroup_limit_bytes, src, "cgroup"
        return ram, ram_src, "ram"

    @property
    def available_now_bytes(self) -> int | None:
        """MemAvailable now, capped by what the cgroup still allows (limit - usage)."""
        if self.mem_available_bytes is None:
            return None
        if self.cgroup_limit_bytes is not None and self.cgroup_usage_bytes is not None:
            return min(self.mem_available_bytes, max(self.cgroup_limit_bytes - self.cgroup_usage_bytes, 0))
        return self.mem_available_bytes
