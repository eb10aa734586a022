"""Drift check: the sizes the server logged (and reports) against the sizes the plan predicted.

Once the server is ready, ``up`` and ``serve --profile`` read its log, parse the pool sizes
SGLang 0.5.19 prints, read its ``/server_info`` where it answers, and report every figure that
differs from the plan, so every real run calibrates the planner. Counts (tokens, slots,
requests) must be equal; a byte figure SGLang prints as ``%.2f`` GB must print the same as the
plan's bytes do (equal at the log's printed precision). Pure: lines and a JSON object in,
``DriftReport`` out; ``DriftReport.report_lines`` is what both commands print.

The log formats, verbatim from the 0.5.19 wheel:

- ``sglang/srt/mem_cache/pool_host/base.py`` ``HostKVCache.__init__``:
  ``"Allocating %s hierarchical KV host pool: %d tokens, %.2f GB host memory."`` (label,
  tokens, bytes / 1e9); with MTP draft layers the sentence continues
  ``", packed MTP KV layers: ..."`` instead of ending.
- ``sglang/srt/mem_cache/pool_host/mamba.py``:
  ``"Allocating %.2f GB host memory for hierarchical Mamba cache (layout=%s)."``
- ``sglang/srt/managers/scheduler.py`` ``Scheduler.__init__`` (TP rank 0 only):
  ``f"max_total_num_tokens={self.max_total_num_tokens}, chunked_prefill_size=...,
  max_prefill_tokens=..., max_running_requests={self.max_running_requests},
  context_len={self.model_config.context_len}, available_gpu_mem={...:.2f} GB"``
  (``available_cpu_mem`` on a CPU device); ``max_running_requests`` is the effective figure,
  after ``kv_cache_configurator.py: KVCacheConfigurator.resolve_max_num_reqs`` capped it.
- ``sglang/srt/mem_cache/memory_pool.py`` ``KVCache._finalize_allocation_log(size)`` (every
  rank): ``f"{cache_name} is allocated. dtype: {self.dtype}, #tokens: {num_tokens}, K size:
  ...GB, V size: ...GB"`` (or ``KV size: ...``); ``cache_name`` is ``KV Cache`` for the model's
  own pool (a labelled pool, ``"<label> KV Cache"``, is not planned here).
- ``sglang/srt/mem_cache/memory_pool.py`` ``MambaPool.__init__``:
  ``f"Mamba Cache is allocated. max_mamba_cache_size: {size}, conv_state size: ...GB, ..."``.

``/server_info`` (``sglang/srt/entrypoints/http_server.py`` ``server_info``; ``/get_server_info``
is its deprecated alias) returns ``server_args.resolved_dict()`` merged with the scheduler's
init info (``scheduler.py: Scheduler.get_init_info``: ``max_total_num_tokens``) and
``internal_states``, one per DP rank (``Scheduler.get_internal_state``:
``effective_max_running_requests_per_dp``, ``memory_usage.token_capacity``). Its
``context_length`` and ``max_mamba_cache_size`` are the server arguments (null when unset).

Each line carries the logger prefix ``[%Y-%m-%d %H:%M:%S TP<n>]`` from
``sglang/srt/utils/common.py`` ``configure_logger`` (scheduler processes add `` TP<n>``); the
rank is read from it, and per-rank figures are compared rank by rank.

GB here is 1e9 bytes, as SGLang prints it (``bytes / 1e9`` formatted ``%.2f``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .progress import Level

_RANK = re.compile(r"^\[[^\]]*? TP(\d+)[^\]]*\]")
_HOST_KV = re.compile(
    r"Allocating (\S+) hierarchical KV host pool: (\d+) tokens, ([\d.]+) GB host memory[.,]"
)
_HOST_MAMBA = re.compile(
    r"Allocating ([\d.]+) GB host memory for hierarchical Mamba cache \(layout=([^)]*)\)\."
)
_SCHED = re.compile(
    r"max_total_num_tokens=(\d+),.*?max_running_requests=(\d+), context_len=(\d+), "
    r"available_(?:gpu|cpu)_mem=([\d.]+) GB"
)
_KV_DEV = re.compile(r"(?:^|\] )KV Cache is allocated\. dtype: \S+, #tokens: (\d+),")
_MAMBA_DEV = re.compile(r"Mamba Cache is allocated\. max_mamba_cache_size: (\d+),")


class RankSizes(BaseModel):
    """Sizes one TP rank logged (None when that line was not seen)."""

    model_config = ConfigDict(extra="forbid")
    host_kv_tokens: int | None = None
    host_kv_bytes: int | None = Field(default=None, description="from the printed GB, x 1e9")
    host_mamba_bytes: int | None = Field(default=None, description="from the printed GB, x 1e9")
    device_mamba_slots: int | None = None
    device_kv_tokens: int | None = Field(default=None, description="the KV Cache line's #tokens")


class ObservedSizes(BaseModel):
    """What the server logged: per-rank host pools, plus rank 0's scheduler line."""

    model_config = ConfigDict(extra="forbid")
    ranks: dict[int, RankSizes] = Field(default_factory=dict)
    max_total_num_tokens: int | None = None
    max_running_requests: int | None = Field(default=None, description="the effective figure rank 0 logged")
    context_len: int | None = Field(default=None, description="tokens, the model config's context_len")
    available_gpu_mem_bytes: int | None = Field(
        default=None, description="rank 0's available_gpu_mem after startup, GB x 1e9"
    )


class ServerInfo(BaseModel):
    """The figures ``/server_info`` reports that the plan predicts (None: not reported)."""

    model_config = ConfigDict(extra="forbid")
    max_total_num_tokens: int | None = Field(default=None, description="device KV tokens (scheduler init info)")
    max_running_requests: int | None = Field(
        default=None, description="internal_states[0].effective_max_running_requests_per_dp")
    context_length: int | None = Field(default=None, description="the server argument (tokens)")
    max_mamba_cache_size: int | None = Field(default=None, description="the server argument (slots)")


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
    max_running_requests: int | None = Field(default=None, description="the effective figure, after "
                                             "SGLang's caps (launch.prepare.planned_sizes)")
    context_length: int | None = Field(default=None, description="tokens")
    available_gpu_mem_bytes: int | None = None


class DriftItem(BaseModel):
    model_config = ConfigDict(frozen=True)
    figure: str
    rank: int | None
    planned: int
    observed: int
    unit: str = Field(description="bytes or tokens or slots or requests")
    source: Literal["log", "server_info"] = Field("log", description="where the observed figure came from")

    @property
    def relative(self) -> float:
        return (self.observed - self.planned) / self.planned if self.planned else float("inf")

    def line(self) -> str:
        where = f" rank {self.rank}" if self.rank is not None else ""
        if self.unit == "bytes":
            p, o = f"{self.planned / 1e9:.2f} GB", f"{self.observed / 1e9:.2f} GB"
        else:
            p, o = f"{self.planned:,} {self.unit}", f"{self.observed:,} {self.unit}"
        said = "server logged" if self.source == "log" else "/server_info reports"
        return f"drift: {self.figure}{where}: planned {p}, {said} {o} ({self.relative:+.1%})"


class DriftReport(BaseModel):
    model_config = ConfigDict(frozen=True)
    observed: ObservedSizes
    items: list[DriftItem] = Field(description="figures that differ")
    compared: int = Field(description="how many planned/observed pairs were compared")
    compared_server_info: int = Field(0, description="how many of them came from /server_info")
    server_info_not_compared: str | None = Field(
        None, description="why no /server_info figure was compared (None: some were)")

    def report_lines(self, verb: str) -> list[tuple[Level, str]]:
        """``(level, line)`` pairs, what ``up`` and ``serve`` print once the server is ready
        (``verb`` names the command): a ``warning`` ``drift: ...`` line per figure that differs
        (``DriftItem.line``), else one ``info`` line saying how many figures agreed. When the
        ``/server_info`` half was not compared, one ``warning`` line says what was compared and
        that it was not, and why; "the server's sizes are the plan's" is never said then.
        Never changes the command's exit status: the server is up and serving."""
        log = self.compared - self.compared_server_info
        skipped = self.server_info_not_compared
        not_compared = f"/server_info not compared: {skipped}" if skipped else None
        if self.items:
            return [("warning", i.line()) for i in self.items] + (
                [("warning", f"{verb}: {log} figures from the server's log compared; {not_compared}")]
                if not_compared else [])
        if not self.compared:
            return [("warning" if not_compared else "info",
                     f"{verb}: no pool size the plan predicts was found in the server's log"
                     + (f"; {not_compared}" if not_compared else ""))]
        if not_compared:
            return [("warning", f"{verb}: {log} figures from the server's log are the plan's; {not_compared}")]
        return [("info", f"{verb}: the server's sizes are the plan's ({log} figures from its log"
                         + (f", {self.compared_server_info} from /server_info)" if self.compared_server_info
                            else ")"))]


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
        elif m := _KV_DEV.search(line):
            obs.ranks.setdefault(rank, RankSizes()).device_kv_tokens = int(m.group(1))
        elif m := _MAMBA_DEV.search(line):
            obs.ranks.setdefault(rank, RankSizes()).device_mamba_slots = int(m.group(1))
        elif m := _SCHED.search(line):
            obs.max_total_num_tokens = int(m.group(1))
            obs.max_running_requests = int(m.group(2))
            obs.context_len = int(m.group(3))
            obs.available_gpu_mem_bytes = round(float(m.group(4)) * 1e9)
    return obs


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def server_info_sizes(info: Mapping[str, Any]) -> ServerInfo:
    """The planned figures in a ``/server_info`` JSON object (fields in the module docstring);
    a field that is missing, null or not an integer is None (not compared)."""
    states = info.get("internal_states")
    first = states[0] if isinstance(states, list) and states and isinstance(states[0], Mapping) else {}
    return ServerInfo(max_total_num_tokens=_int(info.get("max_total_num_tokens")),
                      max_running_requests=_int(first.get("effective_max_running_requests_per_dp")),
                      context_length=_int(info.get("context_length")),
                      max_mamba_cache_size=_int(info.get("max_mamba_cache_size")))


def differs(planned: int, observed: int, unit: str) -> bool:
    """Counts differ when they are not equal; bytes (``unit`` ``bytes``) when they do not print
    the same as SGLang prints them, ``bytes / 1e9`` as ``%.2f`` GB."""
    if unit == "bytes":
        return f"{planned / 1e9:.2f}" != f"{observed / 1e9:.2f}"
    return planned != observed


def compare(planned: PlannedSizes, observed: ObservedSizes, server_info: ServerInfo | None = None,
            server_info_why: str | None = None) -> DriftReport:
    """Compare each figure both sides have; report those that differ (``differs``).

    Per-rank figures (host KV tokens and bytes, host mamba bytes, device mamba slots, device
    KV tokens) are
    compared for every rank that logged them; the scheduler figures (``max_total_num_tokens``
    against ``kv_tokens``, max running requests, context length, ``available_gpu_mem``) once;
    then those ``/server_info`` reported (``server_info_sizes``). Without ``server_info``,
    ``server_info_why`` says why it is missing (default "not read"); with one that holds none
    of the figures the plan predicts, that is the reason.
    """
    items: list[DriftItem] = []
    n = n_info = 0

    def check(fig: str, rank: int | None, p: int | None, o: int | None, unit: str,
              source: Literal["log", "server_info"] = "log") -> None:
        nonlocal n, n_info
        if p is None or o is None:
            return
        n += 1
        n_info += source == "server_info"
        if differs(p, o, unit):
            items.append(DriftItem(figure=fig, rank=rank, planned=p, observed=o, unit=unit, source=source))

    check("device KV tokens (max_total_num_tokens)", None, planned.kv_tokens,
          observed.max_total_num_tokens, "tokens")
    check("max running requests", None, planned.max_running_requests, observed.max_running_requests, "requests")
    check("context length", None, planned.context_length, observed.context_len, "tokens")
    check("available GPU memory", None, planned.available_gpu_mem_bytes,
          observed.available_gpu_mem_bytes, "bytes")
    for rank in sorted(observed.ranks):
        r = observed.ranks[rank]
        check("host KV pool tokens", rank, planned.host_kv_tokens, r.host_kv_tokens, "tokens")
        check("host KV pool", rank, planned.host_kv_bytes, r.host_kv_bytes, "bytes")
        check("host mamba pool", rank, planned.host_mamba_bytes, r.host_mamba_bytes, "bytes")
        check("device mamba slots", rank, planned.device_mamba_slots, r.device_mamba_slots, "slots")
        check("device KV tokens", rank, planned.kv_tokens, r.device_kv_tokens, "tokens")
    if server_info is not None:
        si = server_info
        check("device KV tokens (max_total_num_tokens)", None, planned.kv_tokens, si.max_total_num_tokens,
              "tokens", "server_info")
        check("max running requests", None, planned.max_running_requests, si.max_running_requests,
              "requests", "server_info")
        check("context length", None, planned.context_length, si.context_length, "tokens", "server_info")
        check("device mamba slots", None, planned.device_mamba_slots, si.max_mamba_cache_size, "slots",
              "server_info")
    why = (server_info_why or "not read") if server_info is None else (
        None if n_info else "it reported none of the figures the plan predicts")
    return DriftReport(observed=observed, items=items, compared=n, compared_server_info=n_info,
                       server_info_not_compared=why)


def check(planned: PlannedSizes, lines: Iterable[str], server_info: Mapping[str, Any] | None = None,
          server_info_why: str | None = None) -> DriftReport:
    """The drift check ``up`` and ``serve --profile`` run once the server is ready: ``compare``
    of the plan's figures with the server's log lines and, when it answered, its
    ``/server_info`` object (``ready.read_server_info``); else ``server_info_why`` says why not."""
    return compare(planned, parse_sizes(lines),
                   server_info_sizes(server_info) if server_info is not None else None, server_info_why)
