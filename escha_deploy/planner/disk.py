"""The file L3 store's disk (``hicache.l3``, kind ``file``): what SGLang will keep there and
whether the folder's filesystem holds it. Pure: the folder's reading comes in ``HostFacts.l3_dir``.

Disk need = each owning rank's cap (``hicache.l3.max_size``, SGLang's
``SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE``, enforced per rank) x the ranks that keep their own
files (``sglang.filestore.owners``: every TP rank of a non-MLA model; TP rank 0 for MLA, as the
release decides) + the free-space watermark SGLang keeps (``hicache.l3.min_free_space``,
``SGLANG_HICACHE_FILE_BACKEND_MIN_FREE_SPACE``). At start free space plus the store's own files
(SGLang counts them inside the caps: ``LRUFileEvictor._scan_existing_files``) must cover it.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from ..facts.folders import l3_space_problems
from ..facts.host import L3DirReading
from ..sglang.filestore import need_bytes, owners
from ..utils.units import fmt_gb


class L3Disk(BaseModel):
    """The file L3 store's disk as the plan reads it (bytes)."""

    cap_per_rank_bytes: int | None = Field(description="hicache.l3.max_size: each owning rank's cap; None: no cap")
    owner_ranks: int = Field(description="ranks that keep their own files, each under its own cap")
    owners: str = Field(description="which ranks, in words")
    rank_replicated: bool = Field(description="the model's KV is rank-replicated (MLA): the ranks share files")
    min_free_bytes: int = Field(description="hicache.l3.min_free_space: kept free by SGLang (0: its default)")
    need_bytes: int | None = Field(description="cap x owner_ranks + min_free: the disk the tier takes at most; "
                                   "None without a cap (the store grows until the disk is full)")
    page_bytes: int = Field(description="one page's file per rank (page_size x host KV bytes per token): "
                            "the least a cap must hold")
    reading: L3DirReading | None = Field(None, description="the folder where the server runs: its filesystem and "
                                         "the store's current fill; None: not read here")
    source: str


def l3_disk(*, release: str, tp_size: int, mla: bool, hybrid: bool, cap: int | None, min_free: int,
            page_bytes: int, reading: L3DirReading | None) -> tuple[L3Disk, list[str]]:
    """The store's disk and the reasons that make the plan unsafe (each naming its key)."""
    o = owners(release, tp_size, mla=mla, hybrid=hybrid)
    need = need_bytes(cap, o.ranks, min_free) if cap else None
    disk = L3Disk(cap_per_rank_bytes=cap, owner_ranks=o.ranks, owners=o.who, rank_replicated=mla, min_free_bytes=min_free,
                  need_bytes=need, page_bytes=page_bytes, reading=reading,
                  source=f"SGLang {release}: {o.source}")
    unsafe: list[str] = []
    if cap and cap < page_bytes:
        unsafe.append(f"hicache.l3.max_size: {cap:,} B per rank is less than one page's file ({page_bytes:,} B: "
                      f"page_size x KV bytes per token per rank): SGLang stores nothing ('value exceeds cap; not "
                      f"caching', lru_file_evictor.py: LRUFileEvictor.reserve); raise it")
    if reading is not None and (cap or min_free):
        unsafe += l3_space_problems(reading, cap=cap or 0, ranks=o.ranks, min_free=min_free) if cap else [
            p for p in l3_space_problems(reading, cap=0, ranks=o.ranks, min_free=min_free)
            if p.startswith("hicache.l3.min_free_space")]
    return disk, unsafe


def describe(d: L3Disk) -> str:
    """One line: the need, how it is made, and the store's fill where read."""
    if d.need_bytes is None:
        head = f"no cap: the store grows until the disk is full ({d.owners})"
    else:
        wm = f" + min_free_space {fmt_gb(d.min_free_bytes)}" if d.min_free_bytes else ""
        head = (f"needs {fmt_gb(d.need_bytes)}: {fmt_gb(d.cap_per_rank_bytes or 0)} per rank x {d.owner_ranks} "
                f"({d.owners}){wm}")
    r = d.reading
    if r is not None:
        head += (f"; {r.path}: {fmt_gb(r.free_bytes)} free of {fmt_gb(r.fs_bytes)} on {r.mount}, the store holds "
                 f"{fmt_gb(r.store_bytes)} in {r.store_files} files")
    return head
