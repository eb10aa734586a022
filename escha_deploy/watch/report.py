"""One look at a running server as data: ``status --format json``'s object and what the live
view draws (pure). Bytes are bytes, rates per second, shares 0..1, GB/s = 1e9 B/s.

Per rank figures are SGLang's per ``tp_rank`` series; the key ``all`` (``reading.ALL_RANKS``)
holds the series SGLang exports without ``tp_rank``, already summed over the ranks (0.5.19's
radix-cache counters): a figure not exported for a key is None there, never 0 or a share of
the sum. ``total`` sums the keys and names them (``summed_ranks``): token counts summed count
each rank's copy of a token (a TP rank holds its own slice of every cached token).
"""

from __future__ import annotations

from typing import Any

from .alerts import Evaluation
from escha_deploy.launch.planview import PlanView
from .reading import ALL_RANKS, HostWindow, Sample, ServerWindow

#: Figures computed from a counter (the field it is read from), None where the key lacks it.
_FROM = {"load_back_tokens": "load_back_tokens", "load_back_bytes": "load_back_bytes",
         "load_back_seconds": "load_back_seconds", "load_back_gb_per_s": "load_back_bytes",
         "backup_tokens": "backup_tokens", "backup_bytes": "backup_bytes",
         "dropped_tokens": "dropped_tokens", "evicted_tokens": "evicted_tokens"}


def _rank(r: str, w: ServerWindow, plan: PlanView | None) -> dict[str, Any]:
    out = _rank_figures(r, w, plan)
    exported = set(w.ranks[r].now.exported)
    out = {k: (None if k in _FROM and _FROM[k] not in exported else v) for k, v in out.items()}
    if r == ALL_RANKS:  # the plan's pools are per rank; the sum carries no host-pool gauge
        out.update(planned_host_mamba_slots=None, planned_host_tokens=None, planned_host_bytes=None)
    return out


def _rank_figures(r: str, w: ServerWindow, plan: PlanView | None) -> dict[str, Any]:
    rw = w.ranks[r]
    now = rw.now
    fill = (now.host_used_tokens / now.host_total_tokens
            if now.host_used_tokens is not None and now.host_total_tokens else None)
    return {
        "host_used_tokens": now.host_used_tokens, "host_total_tokens": now.host_total_tokens,
        "host_fill": fill,
        "host_mamba_used_states": now.host_mamba_used_states, "host_mamba_total_states": now.host_mamba_total_states,
        "planned_host_mamba_slots": plan.host_mamba_slots if plan and plan.hicache_enabled and plan.hybrid else None,
        "planned_host_tokens": plan.host_kv_tokens if plan and plan.hicache_enabled else None,
        "planned_host_bytes": plan.host_kv_bytes + plan.host_mamba_bytes if plan and plan.hicache_enabled else None,
        "load_back_tokens": rw.load_back_tokens, "load_back_bytes": rw.load_back_bytes,
        "load_back_seconds": rw.load_back_seconds, "load_back_gb_per_s": rw.load_back_gb_per_s,
        "measured_h2d_gb_per_s": plan.h2d_bytes_per_s / 1e9 if plan and plan.h2d_bytes_per_s else None,
        "backup_tokens": rw.backup_tokens, "backup_bytes": rw.backup_bytes,
        "dropped_tokens": rw.dropped_tokens, "evicted_tokens": rw.evicted_tokens,
        "token_usage": now.token_usage, "mamba_usage": now.mamba_usage,
        "num_running": now.num_running, "num_queued": now.num_queued,
    }


def _sum(vals) -> float | None:
    vals = [v for v in vals if v is not None]
    return sum(vals) if vals else None


def server_section(w: ServerWindow, plan: PlanView | None) -> dict[str, Any]:
    ranks = {r: _rank(r, w, plan) for r in w.ranks}
    total = {"summed_ranks": [int(r) if r.isdigit() else r for r in ranks]}
    for k in ("host_used_tokens", "host_total_tokens", "load_back_bytes", "load_back_seconds",
              "backup_bytes", "evicted_tokens", "num_running", "num_queued"):
        total[k] = _sum(v[k] for v in ranks.values())
    for k in ("load_back_tokens", "backup_tokens", "dropped_tokens"):
        agg: dict[str, float] = {}
        for v in ranks.values():
            for kk, x in (v[k] or {}).items():
                agg[kk] = agg.get(kk, 0.0) + x
        total[k] = agg
    rates = [v["load_back_gb_per_s"] for r, v in ranks.items()
             if v["load_back_gb_per_s"] is not None and r != ALL_RANKS]  # per rank only where exported so
    total["load_back_gb_per_s_slowest_rank"] = min(rates) if rates else None
    return {
        "hicache": w.hicache,
        "window": {"seconds": w.seconds, "since_start": w.since_start, "requests": w.requests,
                   "prompt_tokens": w.prompt_tokens, "cached_tokens": w.cached_tokens,
                   "share": {s: w.share(s) for s in ("device", "host", "storage")},
                   "spec_accept_length": {"before": w.spec_accept_before, "after": w.spec_accept_after,
                                          "load_back_tokens": w.load_back_total}},
        "ranks": ranks, "total": total, "unknown_series": list(w.unknown_series),
        "suspect_numbers": list(w.suspect),
    }


def host_section(s: Sample, hw: HostWindow | None, plan: PlanView | None) -> dict[str, Any] | None:
    h = s.host
    if h is None:
        return None
    cg = h.cgroup
    return {
        "mem_total_bytes": h.mem_total_bytes, "mem_available_bytes": h.mem_available_bytes,
        "page_cache_bytes": h.page_cache_bytes,
        "page_cache_floor_bytes": plan.page_cache_floor_bytes if plan else None,
        "swap_total_bytes": h.swap_total_bytes, "swap_free_bytes": h.swap_free_bytes,
        "swap_in_pages_per_s": hw.swap_in_pages_per_s if hw else None,
        "swap_out_pages_per_s": hw.swap_out_pages_per_s if hw else None,
        "psi": h.psi.model_dump() if h.psi else "not available",
        "server_pids": h.server_pids, "server_rss_bytes": h.server_rss_bytes,
        "cgroup": cg.model_dump() if cg else None,
        "cgroup_events_in_window": hw.cgroup_events if hw else {},
    }


def build(row: dict[str, Any], plan: PlanView | None, s: Sample, w: ServerWindow | None,
          hw: HostWindow | None, ev: Evaluation) -> dict[str, Any]:
    """The existing ``status`` row's keys, then the view's: ``kind``-independent."""
    return {
        **row,
        "sampled_at": s.t,
        "plan": plan.model_dump() if plan else None,
        "metrics_error": s.server_error,
        "server": server_section(w, plan) if w is not None else None,
        "host": host_section(s, hw, plan),
        "container_memory": s.container.model_dump() if s.container else None,
        "alerts": [a.model_dump() for a in ev.alerts],
        "not_evaluated": ev.not_evaluated,
    }
