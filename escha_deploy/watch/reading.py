"""What one look at a running box finds, and the arithmetic between two looks (pure).

A ``Sample`` is one scrape of the server's ``/metrics`` (``ServerReading``, per ``tp_rank``)
plus the host's memory files (``HostReading``) and, for a container, Docker's figures
(``ContainerReading``). ``window(new, old)`` turns two samples into deltas and rates: where
cached prompt tokens came from, load-back GB/s (bytes over seconds, as SGLang's
``load_back_bytes_total`` help text defines it), backups, drops, swap pages per second.

Counters are SGLang's (names in ``watch.names``); a server restart resets them, and a delta
that goes negative is taken as "since the restart" (the new value itself), as Prometheus's
``increase()`` does.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from escha_deploy.bench.metrics import Snapshot

from . import names as n
from .procfs import Psi

GB = 1e9

#: The key of series that carry no ``tp_rank``: SGLang's sum over the ranks. In 0.5.19 every
#: rank's radix cache records ``RadixCacheMetricsCollector``'s counters labelled only
#: ``cache_type`` (``mem_cache/base_prefix_cache.py: BasePrefixCache.init_metrics_collector``),
#: and the ``/metrics`` route's ``prometheus_client.multiprocess.MultiProcessCollector`` adds
#: the ranks' counters of one label set into one series (0.5.23 labels them per rank:
#: ``metrics_collector.py: radix_cache_metric_labels``). The view shows them as "all ranks",
#: never under rank 0 nor split per rank.
ALL_RANKS = "all"


class RankReading(BaseModel):
    """One scheduler's (``tp_rank``'s) series, summed over their other labels, or (key
    ``ALL_RANKS``) the series SGLang exports without ``tp_rank``, summed over the ranks by its
    multiprocess registry. Tokens are token counts, bytes bytes, seconds seconds; usage gauges
    are fractions 0..1; None: the series is not exported (HiCache off, not a hybrid model).
    ``exported``: the fields whose series this key has (a counter absent here is 0 in its
    field but not a figure SGLang gave for this key)."""

    model_config = ConfigDict(frozen=True)
    exported: list[str] = Field(default_factory=list)
    host_used_tokens: float | None = None
    host_total_tokens: float | None = None
    host_mamba_used_states: float | None = Field(None, description="SGLang 0.5.23+")
    host_mamba_total_states: float | None = Field(None, description="SGLang 0.5.23+")
    token_usage: float | None = None
    mamba_usage: float | None = None
    num_running: float | None = None
    num_queued: float | None = None
    evicted_tokens: float = 0.0
    load_back_tokens: dict[str, float] = Field(default_factory=dict, description="by pool")
    load_back_bytes: float = 0.0
    load_back_seconds: float = 0.0
    load_back_ops: float = 0.0
    backup_tokens: dict[str, float] = Field(default_factory=dict, description="by pool")
    backup_bytes: float = 0.0
    dropped_tokens: dict[str, float] = Field(default_factory=dict, description="'reason/pool'")
    spec_accept_length: float | None = Field(None, description="speculative acceptance length (gauge; 0: no "
                                             "speculative decoding)")


class ServerReading(BaseModel):
    """One ``/metrics`` scrape. ``cached_tokens`` by ``cache_source``; ``ranks`` by tp_rank
    (string, as the label)."""

    model_config = ConfigDict(frozen=True)
    hicache: bool = Field(description="the host-pool gauges are exported (HiCache on)")
    cached_tokens: dict[str, float] = Field(default_factory=dict)
    prompt_tokens: float = 0.0
    requests: float = 0.0
    ranks: dict[str, RankReading] = Field(default_factory=dict)
    unknown_series: list[str] = Field(
        default_factory=list,
        description="sglang: series no supported release's catalog (metrics.json) defines, by name")
    suspect: list[str] = Field(
        default_factory=list,
        description="one line per figure of this scrape that cannot be true (suspect_numbers)")


class CgroupReading(BaseModel):
    """The server's cgroup v2 memory files (bytes; events are counts since the cgroup began)."""

    model_config = ConfigDict(frozen=True)
    path: str
    current_bytes: int | None = None
    max_bytes: int | None = None
    high_bytes: int | None = None
    anon_bytes: int | None = None
    file_bytes: int | None = None
    events: dict[str, int] = Field(default_factory=dict)
    psi: Psi | None = None


class HostReading(BaseModel):
    """The host's memory (bytes) from ``/proc`` (``watch.procfs`` says which line); swap pages
    are cumulative since boot; ``psi`` None: the kernel has no PSI (not available, not 0)."""

    model_config = ConfigDict(frozen=True)
    mem_total_bytes: int | None = None
    mem_available_bytes: int | None = None
    page_cache_bytes: int | None = None
    swap_total_bytes: int | None = None
    swap_free_bytes: int | None = None
    swap_in_pages: int | None = None
    swap_out_pages: int | None = None
    page_size_bytes: int = 4096
    psi: Psi | None = None
    server_pids: list[int] = Field(default_factory=list)
    server_rss_bytes: int | None = Field(None, description="sum of VmRSS of the server's processes")
    cgroup: CgroupReading | None = None


class ContainerReading(BaseModel):
    """A container's memory from the Docker API's stats (``memory_stats``) and its events
    since ``status`` began watching (``oom``, ``die``, ...), plus ``State.OOMKilled``."""

    model_config = ConfigDict(frozen=True)
    name: str
    usage_bytes: int | None = None
    limit_bytes: int | None = None
    file_bytes: int | None = None
    anon_bytes: int | None = None
    events: list[str] = Field(default_factory=list)
    oom_killed: bool = False


class Sample(BaseModel):
    """One look: ``t`` is Unix time in seconds. ``server`` None with ``server_error``: the
    server did not answer, or answered without metrics."""

    model_config = ConfigDict(frozen=True)
    t: float
    server: ServerReading | None = None
    server_error: str | None = None
    host: HostReading | None = None
    container: ContainerReading | None = None


def _by_rank(snap: Snapshot, name: str, label: str | None = None) -> dict[str, dict[str, float]]:
    """rank -> (label value or '') -> sum of the series of ``name``."""
    out: dict[str, dict[str, float]] = {}
    for (nm, labels), v in snap.samples.items():
        if nm != name:
            continue
        d = dict(labels)
        key = d.get(label, "") if label else ""
        if label == "reason":
            key = f"{d.get('reason', '')}/{d.get('pool', '')}"
        r = out.setdefault(d.get("tp_rank", ALL_RANKS), {})
        r[key] = r.get(key, 0.0) + v
    return out


def server_reading(snap: Snapshot) -> ServerReading:
    """A parsed scrape -> ``ServerReading``. Sums series that differ only in labels other than
    ``tp_rank`` and the one each metric is read by (``names.LABELS``)."""
    cached: dict[str, float] = {}
    for (nm, labels), v in snap.samples.items():
        if nm == n.CACHED_TOKENS:
            src = dict(labels).get("cache_source", "total")
            cached[src] = cached.get(src, 0.0) + v
    tables = {
        "host_used_tokens": _by_rank(snap, n.HOST_USED_TOKENS),
        "host_total_tokens": _by_rank(snap, n.HOST_TOTAL_TOKENS),
        "host_mamba_used_states": _by_rank(snap, n.HOST_MAMBA_USED_STATES),
        "host_mamba_total_states": _by_rank(snap, n.HOST_MAMBA_TOTAL_STATES),
        "token_usage": _by_rank(snap, n.TOKEN_USAGE),
        "mamba_usage": _by_rank(snap, n.MAMBA_USAGE),
        "num_running": _by_rank(snap, n.NUM_RUNNING),
        "num_queued": _by_rank(snap, n.NUM_QUEUED),
        "evicted_tokens": _by_rank(snap, n.EVICTED_TOKENS),
        "load_back_bytes": _by_rank(snap, n.LOAD_BACK_BYTES),
        "load_back_seconds": _by_rank(snap, n.LOAD_BACK_SECONDS + "_sum"),
        "load_back_ops": _by_rank(snap, n.LOAD_BACK_SECONDS + "_count"),
        "backup_bytes": _by_rank(snap, n.BACKUP_BYTES),
        "spec_accept_length": _by_rank(snap, n.SPEC_ACCEPT_LENGTH),
    }
    labelled = {
        "load_back_tokens": _by_rank(snap, n.LOAD_BACK_TOKENS, "pool"),
        "backup_tokens": _by_rank(snap, n.BACKUP_TOKENS, "pool"),
        "dropped_tokens": _by_rank(snap, n.DROPPED_TOKENS, "reason"),
    }
    ranks = sorted({r for t in (*tables.values(), *labelled.values()) for r in t}, key=_rank_key)
    out: dict[str, RankReading] = {}
    for r in ranks:
        fields: dict = {}
        for k, t in tables.items():
            if r in t:
                fields[k] = t[r].get("", 0.0)
        for k, t in labelled.items():
            if r in t:
                fields[k] = dict(t[r])
        out[r] = RankReading(**fields, exported=sorted(fields))
    reading = ServerReading(hicache=snap.has(n.HOST_TOTAL_TOKENS), cached_tokens=cached,
                            prompt_tokens=snap.total(n.PROMPT_TOKENS),
                            requests=snap.total(n.NUM_REQUESTS), ranks=out,
                            unknown_series=unknown_series(snap))
    return reading.model_copy(update={"suspect": suspect_numbers(snap, reading)})


#: At most this many suspect lines per look (the rest counted in the last one).
MAX_SUSPECT_LINES = 6


def _pct(x: float) -> str:
    return f"{x * 100:,.0f} %"


def _cap(lines: list[str]) -> list[str]:
    if len(lines) <= MAX_SUSPECT_LINES:
        return lines
    return [*lines[: MAX_SUSPECT_LINES - 1], f"and {len(lines) - MAX_SUSPECT_LINES + 1} more suspect figures"]


def suspect_numbers(snap: Snapshot, r: ServerReading) -> list[str]:
    """One line per figure of one scrape that cannot be true, each shown as read (never
    clamped): a share outside 0..100 % (``token_usage`` and ``mamba_usage`` are fractions of a
    pool, SGLang 0.5.19 ``scheduler_metrics_mixin.py``; the host pool's used tokens over its
    total), a token count or counter below 0, more cached prompt tokens than prompt tokens
    (``cached_tokens_total`` counts a part of each finished request's prompt,
    ``metrics_collector.py: observe_one_finished_request``), a series the text gives twice (the
    last value is kept), and samples after ``# EOF`` (OpenMetrics 1.0: the text ends there)."""
    from escha_deploy.utils.httpread import series_name

    out: list[str] = []
    for rk, rr in r.ranks.items():
        who = rank_name(rk)
        for label, v in (("device KV use (sglang:token_usage)", rr.token_usage),
                         ("mamba use (sglang:mamba_usage)", rr.mamba_usage)):
            if v is not None and not 0.0 <= v <= 1.0:
                out.append(f"{who}: {label} is {_pct(v)}, outside 0-100 %")
        used, total = rr.host_used_tokens, rr.host_total_tokens
        if used is not None and total is not None and (used < 0 or total < 0 or used > total):
            fill = f" ({_pct(used / total)})" if total > 0 else ""
            out.append(f"{who}: host pool fill is {used:,.0f} of {total:,.0f} tokens{fill}, outside 0-100 %")
        for fname in ("evicted_tokens", "load_back_bytes", "load_back_seconds", "backup_bytes"):
            v = getattr(rr, fname)
            if v < 0:
                out.append(f"{who}: {fname.replace('_', ' ')} is {v:,.0f}, below 0 (a counter)")
    if r.prompt_tokens < 0 or r.requests < 0:
        out.append(f"prompt tokens {r.prompt_tokens:,.0f} / requests {r.requests:,.0f}: a counter below 0")
    cached = sum(r.cached_tokens.values())
    if cached > r.prompt_tokens >= 0 and snap.has(n.PROMPT_TOKENS):
        out.append(f"{cached:,.0f} cached prompt tokens, more than the {r.prompt_tokens:,.0f} prompt "
                   "tokens (sglang:cached_tokens_total, sglang:prompt_tokens_total)")
    if snap.duplicates:
        out.append(f"{len(snap.duplicates)} series given twice or more (the last value read): "
                   + ", ".join(series_name(k) for k in snap.duplicates[:2])
                   + (" ..." if len(snap.duplicates) > 2 else ""))
    if snap.after_eof:
        out.append(f"{snap.after_eof} samples after '# EOF', where the text must end (read anyway)")
    return _cap(out)


_SUFFIXES = ("_bucket", "_sum", "_count", "_created")


def unknown_series(snap: Snapshot) -> list[str]:
    """The ``sglang:`` metric names in ``snap`` that no supported release's catalog defines
    (a histogram's ``_bucket``/``_sum``/``_count`` samples are named by the histogram). A
    release added later may export more; the view names them and reads the rest."""
    from .names import known_metric_names

    known = known_metric_names()
    out = set()
    for nm, _ in snap.samples:
        if not nm.startswith("sglang:") or nm in known:
            continue
        base = next((nm[: -len(x)] for x in _SUFFIXES if nm.endswith(x)), nm)
        if base not in known:
            out.add(base)
    return sorted(out)


def rank_name(r: str) -> str:
    """How the view names a rank key: ``rank 0``, or ``all ranks`` (``ALL_RANKS``)."""
    return "all ranks" if r == ALL_RANKS else f"rank {r}"


def _rank_key(r: str) -> tuple[int, str]:
    # isdecimal, not isdigit: int() refuses a superscript digit; 9 digits: no huge int from a label
    return (int(r), r) if r.isdecimal() and len(r) <= 9 else (1 << 30, r)


# ---- two looks -> a window --------------------------------------------------------------------


def _inc(new: float, old: float | None) -> float:
    """Counter increase; a counter that went down restarted, so the increase is ``new``."""
    if old is None:
        return new
    return new - old if new >= old else new


def _inc_map(new: dict[str, float], old: dict[str, float] | None) -> dict[str, float]:
    old = old or {}
    return {k: _inc(v, old.get(k)) for k, v in new.items()}


class RankWindow(BaseModel):
    """One rank's counters over the window (tokens, bytes, seconds) and the gauges now."""

    model_config = ConfigDict(frozen=True)
    now: RankReading
    evicted_tokens: float
    load_back_tokens: dict[str, float]
    load_back_bytes: float
    load_back_seconds: float
    backup_tokens: dict[str, float]
    backup_bytes: float
    dropped_tokens: dict[str, float]

    @property
    def load_back_gb_per_s(self) -> float | None:
        """Achieved host -> device bandwidth while transferring, GB/s (1e9 B/s): bytes over
        the summed copy time (SGLang's ``load_back_bytes_total`` help text); None: no copy."""
        if self.load_back_seconds <= 0 or self.load_back_bytes <= 0:
            return None
        return self.load_back_bytes / self.load_back_seconds / GB

    @property
    def load_back_seconds_per_token(self) -> float | None:
        """Copy seconds per KV token loaded back; None: nothing loaded back."""
        kv = self.load_back_tokens.get("kv", 0.0)
        if kv <= 0 or self.load_back_seconds <= 0:
            return None
        return self.load_back_seconds / kv


class ServerWindow(BaseModel):
    """The server's counters over ``seconds`` (``since_start``: from the counters' zero, i.e.
    the server's start or last restart)."""

    model_config = ConfigDict(frozen=True)
    seconds: float | None
    since_start: bool
    hicache: bool
    requests: float
    prompt_tokens: float
    cached_tokens: dict[str, float]
    ranks: dict[str, RankWindow]
    unknown_series: list[str] = Field(default_factory=list)
    suspect: list[str] = Field(default_factory=list, description="figures that cannot be true "
                               "(``suspect_numbers``, ``backwards``), one line each")
    spec_accept_before: float | None = Field(None, description="speculative acceptance length at the window's "
                                             "start (mean over the ranks exporting it > 0; None: unknown or no "
                                             "speculative decoding)")
    spec_accept_after: float | None = Field(None, description="the same at the window's end")

    @property
    def load_back_total(self) -> float:
        """Tokens loaded back from the host over the window, every pool and rank."""
        return sum(sum(rw.load_back_tokens.values()) for rw in self.ranks.values())

    def share(self, source: str) -> float | None:
        """Share (0..1) of the window's cached prompt tokens that came from ``source``
        (``device``, ``host``, ``storage`` = every ``storage_<backend>``); None: none cached."""
        per = {k: v for k, v in self.cached_tokens.items() if k != "total"}
        total = sum(per.values())
        if total <= 0:
            return None
        if source == "storage":
            return sum(v for k, v in per.items() if k.startswith("storage_")) / total
        return per.get(source, 0.0) / total

    @property
    def cached_total(self) -> float:
        """Cached prompt tokens of the window, all sources (``total`` when per-tier is absent)."""
        return sum(self.cached_tokens.values())


def server_window(new: ServerReading, old: ServerReading | None, seconds: float | None) -> ServerWindow:
    """Deltas between two scrapes (``old`` None: since the counters' zero)."""
    ranks = {}
    for r, now in new.ranks.items():
        o = old.ranks.get(r) if old else None
        ranks[r] = RankWindow(
            now=now,
            evicted_tokens=_inc(now.evicted_tokens, o.evicted_tokens if o else None),
            load_back_tokens=_inc_map(now.load_back_tokens, o.load_back_tokens if o else None),
            load_back_bytes=_inc(now.load_back_bytes, o.load_back_bytes if o else None),
            load_back_seconds=_inc(now.load_back_seconds, o.load_back_seconds if o else None),
            backup_tokens=_inc_map(now.backup_tokens, o.backup_tokens if o else None),
            backup_bytes=_inc(now.backup_bytes, o.backup_bytes if o else None),
            dropped_tokens=_inc_map(now.dropped_tokens, o.dropped_tokens if o else None))
    w = ServerWindow(
        seconds=seconds, since_start=old is None, hicache=new.hicache,
        requests=_inc(new.requests, old.requests if old else None),
        prompt_tokens=_inc(new.prompt_tokens, old.prompt_tokens if old else None),
        cached_tokens=_inc_map(new.cached_tokens, old.cached_tokens if old else None),
        ranks=ranks, unknown_series=new.unknown_series,
        spec_accept_before=_accept(old), spec_accept_after=_accept(new))
    suspect = list(new.suspect)
    if old is not None:
        suspect += backwards(new, old)
        if w.cached_total > w.prompt_tokens >= 0 and not any("cached prompt tokens" in x for x in suspect):
            suspect.append(f"{w.cached_total:,.0f} cached prompt tokens in the window, more than its "
                           f"{w.prompt_tokens:,.0f} prompt tokens")
    return w.model_copy(update={"suspect": _cap(suspect)})


def _counters(r: ServerReading) -> dict[str, float]:
    """Every counter of a reading by a name for messages."""
    out = {n.PROMPT_TOKENS: r.prompt_tokens}
    out.update({f"{n.CACHED_TOKENS}{{cache_source={k}}}": v for k, v in r.cached_tokens.items()})
    for rk, rr in r.ranks.items():
        for fname in ("evicted_tokens", "load_back_bytes", "load_back_seconds", "load_back_ops", "backup_bytes"):
            if fname in rr.exported:
                out[f"{rank_name(rk)}: {fname.replace('_', ' ')}"] = getattr(rr, fname)
        for fname in ("load_back_tokens", "backup_tokens", "dropped_tokens"):
            for k, v in getattr(rr, fname).items():
                out[f"{rank_name(rk)}: {fname.replace('_', ' ')} {k}"] = v
    return out


def backwards(new: ServerReading, old: ServerReading) -> list[str]:
    """Counters that went down between two looks while the request count did not: not a
    restart (a restart sets every counter back, the request count too, and the window counts
    from the new values, as Prometheus's ``increase()`` does), so a figure that cannot be true.
    One line, naming at most two of them."""
    if new.requests < old.requests:
        return []
    was = _counters(old)
    down = [(k, was[k], v) for k, v in _counters(new).items() if k in was and v < was[k]]
    if not down:
        return []
    shown = ", ".join(f"{k} {a:,.0f} -> {b:,.0f}" for k, a, b in down[:2])
    more = f" and {len(down) - 2} more" if len(down) > 2 else ""
    return [f"counter went backwards while the request count did not (not a restart): {shown}{more}"]


def _accept(r: ServerReading | None) -> float | None:
    """The speculative acceptance length of a scrape: the mean over the ranks whose gauge is
    above 0 (SGLang exports 0.0 without speculative decoding); None: none."""
    vals = [rr.spec_accept_length for rr in (r.ranks.values() if r else ()) if rr.spec_accept_length]
    return sum(vals) / len(vals) if vals else None


class HostWindow(BaseModel):
    """Host rates over ``seconds``: swap pages per second (``/proc/vmstat``), and cgroup
    memory events that happened in the window (``memory.events`` deltas)."""

    model_config = ConfigDict(frozen=True)
    seconds: float
    swap_in_pages_per_s: float | None = None
    swap_out_pages_per_s: float | None = None
    cgroup_events: dict[str, int] = Field(default_factory=dict)


def host_window(new: HostReading, old: HostReading, seconds: float) -> HostWindow:
    """Rates between two host readings ``seconds`` apart (> 0)."""
    def rate(a: int | None, b: int | None) -> float | None:
        if a is None or b is None or seconds <= 0:
            return None
        return max(a - b, 0) / seconds

    events: dict[str, int] = {}
    if new.cgroup and old.cgroup and new.cgroup.path == old.cgroup.path:
        events = {k: v - old.cgroup.events.get(k, 0) for k, v in new.cgroup.events.items()
                  if v - old.cgroup.events.get(k, 0) > 0}
    return HostWindow(seconds=seconds, swap_in_pages_per_s=rate(new.swap_in_pages, old.swap_in_pages),
                      swap_out_pages_per_s=rate(new.swap_out_pages, old.swap_out_pages),
                      cgroup_events=events)
