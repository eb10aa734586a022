"""The live view's drawing: one report row (``watch.report.build``) -> rich renderables.
GB are 1e9 bytes, as SGLang prints them."""

from __future__ import annotations

from typing import Any

from .reading import ALL_RANKS, rank_name


def _gb(b: float | None) -> str:
    return "-" if b is None else f"{b / 1e9:,.2f} GB"


def _n(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def _pools(d: dict[str, float] | None) -> str:
    if d is None:
        return "-"
    return " ".join(f"{k} {_n(v)}" for k, v in sorted(d.items()) if v) or "0"


def render_row(row: dict[str, Any]):
    """A rich Group for one server: header, host tier per rank, the host, device pools, alerts."""
    from rich.console import Group
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    from escha_deploy.utils.termtext import printable

    parts: list = []
    who = "" if row.get("kind") == "endpoint" else f"{escape(str(row.get('container') or 'pid ' + str(row.get('pid', '?'))))} "
    up = "" if row["uptime_s"] is None else f"  up {row['uptime_s']} s"
    head = (f"[bold]{escape(row['profile'])}[/] {row.get('kind', '')} {who}"
            f"{escape(str(row['endpoint']))}  plan {row['plan_digest'] or '-'}{up}")
    parts.append(Text.from_markup(head))
    srv, plan = row.get("server"), row.get("plan")
    if row.get("metrics_error"):
        parts.append(Text.from_markup(f"[yellow]metrics: {escape(row['metrics_error'])}[/]"))
    if srv:
        w = srv["window"]
        span = "since the server started" if w["since_start"] else f"over {w['seconds']:.0f} s"
        sh = w["share"]
        parts.append(Text(f"cached prompt tokens {span}: {_n(sum(w['cached_tokens'].values()))} of "
                          f"{_n(w['prompt_tokens'])} prompt tokens, {_n(w['requests'])} requests; from "
                          f"device {_pct(sh['device'])}, host {_pct(sh['host'])}, storage {_pct(sh['storage'])}"))
        acc = w.get("spec_accept_length") or {}
        if acc.get("after"):  # speculative decoding ran: its acceptance before and after the window's host hits
            from escha_deploy.bench.metrics import acceptance_text

            parts.append(Text(f"speculative acceptance {span}: " + acceptance_text(
                acc.get("before"), acc["after"], acc.get("load_back_tokens") or 0.0)))
        ranks = srv["ranks"]
        tot = srv["total"]
        title = "host tier and device pools, per tp_rank"
        if ALL_RANKS in ranks:
            title += " (all ranks: series SGLang exports summed over the ranks)"
        t = Table(title=title, title_justify="left", box=None, pad_edge=False)
        t.add_column("")
        for r in ranks:
            t.add_column(rank_name(r), overflow="fold")
        multi = len(ranks) > 1
        if multi:
            t.add_column("total " + ",".join(map(str, tot["summed_ranks"])), overflow="fold")

        def gbps(v):
            g = "-" if v["load_back_gb_per_s"] is None else f"{v['load_back_gb_per_s']:.2f}"
            return g + (f" ({v['measured_h2d_gb_per_s']:.1f} measured)" if v["measured_h2d_gb_per_s"] else "")

        lines = [
            ("host tokens used / total", lambda v: f"{_n(v['host_used_tokens'])} / {_n(v['host_total_tokens'])}",
             f"{_n(tot['host_used_tokens'])} / {_n(tot['host_total_tokens'])}"),
            ("host fill", lambda v: _pct(v["host_fill"]), ""),
            ("host mamba states used / total", lambda v: "-" if v["host_mamba_total_states"] is None else
             f"{_n(v['host_mamba_used_states'])} / {_n(v['host_mamba_total_states'])}", ""),
            ("planned host pool", lambda v: "-" if v["planned_host_tokens"] is None else
             f"{_n(v['planned_host_tokens'])} tokens, {_gb(v['planned_host_bytes'])}", ""),
            ("loaded back (tokens)", lambda v: _pools(v["load_back_tokens"]), _pools(tot["load_back_tokens"])),
            ("load-back GB/s", gbps, "-" if tot["load_back_gb_per_s_slowest_rank"] is None
             else f"{tot['load_back_gb_per_s_slowest_rank']:.2f} slowest"),
            ("backed up (tokens)", lambda v: _pools(v["backup_tokens"]), _pools(tot["backup_tokens"])),
            ("dropped, no backup", lambda v: _pools(v["dropped_tokens"]), _pools(tot["dropped_tokens"])),
            ("evicted from device", lambda v: _n(v["evicted_tokens"]), _n(tot["evicted_tokens"])),
            ("device KV / mamba use", lambda v: f"{_pct(v['token_usage'])} / {_pct(v['mamba_usage'])}", ""),
            ("running / queued", lambda v: f"{_n(v['num_running'])} / {_n(v['num_queued'])}",
             f"{_n(tot['num_running'])} / {_n(tot['num_queued'])}"),
        ]
        for label, cell, total in lines:
            t.add_row(label, *(cell(v) for v in ranks.values()), *((total,) if multi else ()))
        parts.append(t)
        for line in srv.get("suspect_numbers") or ():
            parts.append(Text(f"warning: suspect figure: {printable(line)}", style="yellow"))
        if srv.get("unknown_series"):
            parts.append(Text("series no supported release defines (not read): "
                              + ", ".join(srv["unknown_series"]), style="yellow"))
    h = row.get("host")
    if h:
        psi = h["psi"]
        psi_s = psi if isinstance(psi, str) else f"some avg10 {psi['some_avg10']:.1f} %"
        swap = ("-" if h["swap_in_pages_per_s"] is None
                else f"in {h['swap_in_pages_per_s']:.1f} / out {h['swap_out_pages_per_s']:.1f} pages/s")
        floor = f" (floor {_gb(h['page_cache_floor_bytes'])})" if h.get("page_cache_floor_bytes") else ""
        line = (f"host: MemAvailable {_gb(h['mem_available_bytes'])} of {_gb(h['mem_total_bytes'])}, "
                f"page cache {_gb(h['page_cache_bytes'])}{floor}, swap {swap}, memory PSI {psi_s}, "
                f"server RSS {_gb(h['server_rss_bytes'])} ({len(h['server_pids'])} processes)")
        if h.get("cgroup"):
            cg = h["cgroup"]
            line += f", cgroup {cg['path']} {_gb(cg['current_bytes'])} of {_gb(cg['max_bytes'])}"
        parts.append(Text(line))
    cm = row.get("container_memory")
    if cm:
        parts.append(Text(f"container {cm['name']}: memory {_gb(cm['usage_bytes'])} of {_gb(cm['limit_bytes'])}, "
                          f"file {_gb(cm['file_bytes'])}, anon {_gb(cm['anon_bytes'])}; events "
                          f"{', '.join(cm['events']) or 'none'}{'; OOM killed' if cm['oom_killed'] else ''}"))
    si = row.get("server_info")
    if si:  # an --endpoint server: what it says it runs
        parts.append(Text("server_info: " + ", ".join(f"{k} {v}" for k, v in si.items() if v is not None)))
    elif row.get("server_info_error"):
        parts.append(Text(f"/server_info: {row['server_info_error']}", style="yellow"))
    for note in row.get("notes") or []:
        parts.append(Text(f"note: {note}", style="dim"))
    if plan is None and row.get("kind") != "endpoint":
        parts.append(Text("plan: no figures (not started by this escha-deploy's up or serve)", style="dim"))
    for a in row.get("alerts", []):
        parts.append(Text.from_markup(f"[bold red]ALERT {a['id']}[/]: {escape(a['title'])}\n"
                                      f"  evidence: {escape(a['evidence'])}\n  fix: {escape(a['fix'])}"))
    if not row.get("alerts") and row.get("metrics_error"):  # nothing read, nothing cleared
        parts.append(Text("no server alerts judged: its metrics could not be read", style="yellow"))
    elif not row.get("alerts"):
        parts.append(Text("no alerts", style="green"))
    return Group(*parts)
