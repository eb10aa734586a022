"""Drift check: the sizes the server logged against the sizes the plan predicted.

Once the server is ready, ``up`` reads its log, parses the pool sizes SGLang 0.5.19 prints, and
reports every figure that differs from the plan by more than 1 %, so every real run calibrates
the planner. Pure: lines in, ``DriftReport`` out.

The log formats, verbatim from the 0.5.19 wheel:

- ``sglang/srt/mem_cache/pool_host/base.py`` ``HostKVCache.__init__``:
  ``"Allocating %s hierarchical KV host pool: %d tokens, %.2f GB host memory."`` (label,
  tokens, bytes / 1e9); with MTP draft layers the sentence continues
  ``", packed MTP KV layers: ..."`` instead of ending.
- ``sglang/srt/mem_cache/pool_host/mamba.py``:
  ``"Allocating %.2f GB host memory for hierarchical Mamba cache (layout=%s)."``
- ``sglang/srt/managers/scheduler.py`` (TP rank 0 only):
  ``f"max_total_num_tokens={...}, chunked_prefill_size=..., max_prefill_tokens=...,
  max_running_requests=..., context_len=..., available_gpu_mem={:.2f} GB"``
- ``sglang/srt/mem_cache/memory_pool.py``: ``"Mamba Cache is allocated. max_mamba_cache_size:
  {size}, ..."``.

Each line carries the logger prefix ``[%Y-%m-%d %H:%M:%S TP<n>]`` from
``sglang/srt/utils/common.py`` ``configure_logger`` (scheduler processes add `` TP<n>``); the
rank is read from it, and per-rank figures are compared rank by rank.

GB here is 1e9 bytes, as SGLang prints it. A printed ``%.2f`` GB value is known only to
+-0.005 GB, so a difference counts as drift only when it exceeds both 1 % and that rounding.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field

#: Relative difference above which a figure is reported (above 1%).
TOLERANCE = 0.01
#: Half a unit of SGLang's ``%.2f`` GB: the resolution of a printed GB figure, in bytes.
GB_PRINT_RESOLUTION_BYTES = 5_000_000

_RANK = re.compile(r"^\[[^\]]*? TP(\d+)[^\]]*\]")
_HOST_KV = re.compile(
    r"Allocating (\S+) hierarchical KV host pool: (\d+) tokens, ([\d.]+) GB host memory[.,]"
)
_HOST_MAMBA = re.compile(
    r"Allocating ([\d.]+) GB host memory for hierarchical Mamba cache \(layout=([^)]*)\)\."
)
_SCHED = re.compile(
    r"max_total_num_tokens=(\d+),.*?available_(?:gpu|cpu)_mem=([\d.]+) GB"
)
_MAMBA_DEV = re.compile(r"Mamba Cache is allocated\. max_mamba_cache_size: (\d+),")


class RankSizes(BaseModel):
    """Sizes one TP rank logged (None when that line was not seen)."""

    model_config = ConfigDict(extra="forbid")
    host_kv_tokens: int | None = None
    host_kv_bytes: int | None = Field(default=None, description="from the printed GB, x 1e9")
    host_mamba_bytes: int | None = Field(default=None, description="from the printed GB, x 1e9")
    device_mamba_slots: int | None = None


class ObservedSizes(BaseModel):
    """What the server logged: per-rank host pools, plus rank 0's scheduler line."""

    model_config = ConfigDict(extra="forbid")
    ranks: dict[int, RankSizes] = Field(default_factory=dict)
    max_total_num_tokens: int | None = None
    available_gpu_mem_bytes: int | None = Field(
        default=None, description="rank 0's available_gpu_mem after startup, GB x 1e9"
    )


class PlannedSizes(BaseModel):
    """The plan's prediction of the same figures (per rank; None when the plan has none).

    Built from a ``Plan`` by ``planned_sizes(plan)``; tests build it directly.
    """

    model_config = ConfigDict(extra="forbid")
    kv_tokens: int | None = Field(default=None, description="device KV pool tokens per rank")
    host_kv_tokens: int | None = None
    host_kv_bytes: int | None = None
    host_mamba_bytes: int | None = None
    device_mamba_slots: int | None = None
    available_gpu_mem_bytes: int | None = None


class DriftItem(BaseModel):
    model_config = ConfigDict(frozen=True)
    figure: str
    rank: int | None
    planned: int
    observed: int
    unit: str = Field(description="bytes or tokens or slots")

    @property
    def relative(self) -> float:
        return (self.observed - self.planned) / self.planned if self.planned else float("inf")

    def line(self) -> str:
        where = f" rank {self.rank}" if self.rank is not None else ""
        if self.unit == "bytes":
            p, o = f"{self.planned / 1e9:.2f} GB", f"{self.observed / 1e9:.2f} GB"
        else:
            p, o = f"{self.planned:,} {self.unit}", f"{self.observed:,} {self.unit}"
        return f"drift: {self.figure}{where}: planned {p}, server logged {o} ({self.relative:+.1%})"


class DriftReport(BaseModel):
    model_config = ConfigDict(frozen=True)
    observed: ObservedSizes
    items: list[DriftItem] = Field(description="figures differing by more than the tolerance")
    compared: int = Field(description="how many planned/observed pairs were compared")


def parse_sizes(lines: Iterable[str]) -> ObservedSizes:
    """Parse the pool-size lines (formats in the module docstring) from server output.

    Lines without a `` TP<n>`` prefix count as rank 0. A later line for the same rank and
    figure replaces an earlier one (a restarted server logs again).
    """
    obs = ObservedSizes()
    for line in lines:
        rm = _RANK.match(line)
        rank = int(rm.group(1)) if rm else 0
        if m := _HOST_KV.search(line):
            if m.group(1) != "kv":
                continue  # other labelled host pools (indexer etc.) are not planned here
            r = obs.ranks.setdefault(rank, RankSizes())
            r.host_kv_tokens = int(m.group(2))
            r.host_kv_bytes = round(float(m.group(3)) * 1e9)
        elif m := _HOST_MAMBA.search(line):
            obs.ranks.setdefault(rank, RankSizes()).host_mamba_bytes = round(float(m.group(1)) * 1e9)
        elif m := _MAMBA_DEV.search(line):
            obs.ranks.setdefault(rank, RankSizes()).device_mamba_slots = int(m.group(1))
        elif m := _SCHED.search(line):
            obs.max_total_num_tokens = int(m.group(1))
            obs.available_gpu_mem_bytes = round(float(m.group(2)) * 1e9)
    return obs


def _differs(planned: int, observed: int, printed_gb: bool) -> bool:
    diff = abs(observed - planned)
    if printed_gb and diff <= GB_PRINT_RESOLUTION_BYTES:
        return False
    return diff > TOLERANCE * abs(planned)


def compare(planned: PlannedSizes, observed: ObservedSizes) -> DriftReport:
    """Compare each figure both sides have; report those beyond ``TOLERANCE``.

    Per-rank figures (host KV tokens and bytes, host mamba bytes, device mamba slots) are
    compared for every rank that logged them; the scheduler figures (``max_total_num_tokens``
    against ``kv_tokens``, ``available_gpu_mem``) once.
    """
    items: list[DriftItem] = []
    n = 0

    def check(fig: str, rank: int | None, p: int | None, o: int | None, unit: str) -> None:
        nonlocal n
        if p is None or o is None:
            return
        n += 1
        if _differs(p, o, unit == "bytes"):
            items.append(DriftItem(figure=fig, rank=rank, planned=p, observed=o, unit=unit))

    check("device KV tokens (max_total_num_tokens)", None, planned.kv_tokens,
          observed.max_total_num_tokens, "tokens")
    check("available GPU memory", None, planned.available_gpu_mem_bytes,
          observed.available_gpu_mem_bytes, "bytes")
    for rank in sorted(observed.ranks):
        r = observed.ranks[rank]
        check("host KV pool tokens", rank, planned.host_kv_tokens, r.host_kv_tokens, "tokens")
        check("host KV pool", rank, planned.host_kv_bytes, r.host_kv_bytes, "bytes")
        check("host mamba pool", rank, planned.host_mamba_bytes, r.host_mamba_bytes, "bytes")
        check("device mamba slots", rank, planned.device_mamba_slots, r.device_mamba_slots, "slots")
    return DriftReport(observed=observed, items=items, compared=n)
