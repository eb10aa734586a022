"""The human rendering of a ``Plan``: rich tables on stdout, the same data as ``--format json``."""

from __future__ import annotations

import re

from ..planner.result import Plan
from ..utils.units import fmt_gib_gb, fmt_gb, fmt_gib, fmt_mib


def _b(n: int | None) -> str:
    """Bytes with GB (1e9), as SGLang prints host pools."""
    return "-" if n is None else f"{n:,} B ({fmt_gb(n)})"


def _reach_line(p: Plan) -> str | None:
    """The host tier's answer for the planned split (``Plan.host_tier_reach[0]``), and the other
    split's where it brings back more."""
    if not p.host_tier_reach:
        return None
    w = p.host_tier_reach[0]
    load = f"{w.prefixes} x {w.prefix_tokens:,}"
    said = {"all": f"{w.restored} of {w.prefixes} prefixes of {load} come back",
            "none": f"none of the {w.prefixes} prefixes of {load} comes back",
            "not_guaranteed": f"not sure any of the {w.prefixes} prefixes of {load} comes back (LRU decides)"}[w.verdict]
    better = [r for r in p.host_tier_reach[1:] if r.verdict == "all" and (w.verdict != "all" or r.restored > w.restored)]
    if better:
        said += f"; {better[0].restored} of them with {re.sub(r', sized for [^(]*', ' ', better[0].config)}"
    return f"host tier: {said}"


def _next_line(p: Plan, command: list[str], host: list[str]) -> str:
    """What to run next: the reasons' fixes as one re-plan, or the launch (on the planned host)."""
    import shlex

    if p.verdict == "unsafe":
        sets = list(dict.fromkeys(f.set_item() for f in p.fixes if f.problem in p.reasons))
        if sets and all(any(f.problem == r for f in p.fixes) for r in p.reasons):
            keys = {s.partition("=")[0] for s in sets}
            kept = [x for i, x in enumerate(command) if not (  # a --set the fix replaces goes
                (x == "--set" and command[i + 1].partition("=")[0] in keys)
                or (i and command[i - 1] == "--set" and x.partition("=")[0] in keys))]
            argv = ["escha-deploy", "plan", *kept, *host] + [x for s in sets for x in ("--set", s)]
            return f"next: `{shlex.join(argv)}` (the reasons' fix, below)"
        return "next: change what the reasons below name, then plan again"
    up = shlex.join(["escha-deploy", "up", *command])
    if p.host_source in ("described", "facts"):
        return f"next: on the host this plan describes, `{up} --dry-run`, then `{up}`"
    return f"next: `{up} --dry-run`, then `{up}`"


def render_plan(p: Plan, command: list[str] | None = None, host: list[str] | None = None) -> None:
    """Print the plan: its answer first (verdict, ratios, pinned against the budget, the host
    tier's answer, what to run next), then the header and the tables. ``command``: the profile
    and ``--set`` options of this plan (as ``up`` takes them), ``host``: the options that describe
    its host (``plan``'s own), for the commands the next line names."""
    from rich.console import Console
    from rich.table import Table
    from rich.markup import escape

    con = Console(highlight=False)
    colour = {"ok": "green", "hicache_off": "yellow", "unsafe": "red"}[p.verdict]
    hc = p.hicache
    chosen = ("off" if not hc.enabled else f"--hicache-size {hc.size_gb} (GB per rank)" if hc.size_gb
              else f"--hicache-ratio {hc.ratio:g}")
    b = p.budget
    # the answer first, five lines: each is whole however narrow the terminal (soft_wrap)
    short = (f" [bold yellow]but {fmt_gb(p.short_now_bytes)} short of memory available now (warning below)[/]"
             if p.short_now_bytes and p.verdict != "unsafe" else "")
    con.print(f"verdict: [bold {colour}]{p.verdict}[/]{short}: HiCache {chosen}", soft_wrap=True)
    if hc.enabled or p.max_safe_ratio is not None or p.ratio_cap is not None:  # the profile asked for HiCache
        safe = f"largest safe ratio: [bold]{p.max_safe_ratio if p.max_safe_ratio is not None else 'none'}[/]"
        grid = (f"(a {p.safety_policy.ratio_step} grid, >= {fmt_mib(p.safety_policy.recommend_headroom_bytes)} "
                f"headroom, at most the ratio cap {p.ratio_cap} = hicache.max_ratio)")
        if hc.enabled:
            con.print(f"{safe}   recommended: [bold]{p.recommended_ratio if p.recommended_ratio is not None else 'none'}"
                      f"[/] {grid}", soft_wrap=True)
        else:  # HiCache is off in this plan: nothing to recommend
            con.print(f"{safe} {grid}; HiCache off", soft_wrap=True)
    if hc.enabled:
        spare = b.pinned_budget_bytes - p.pinned_total_bytes
        con.print(f"pinned: {fmt_gb(p.per_rank.pinned_bytes)} per rank, [bold]{fmt_gb(p.pinned_total_bytes)} in total[/] "
                  f"against the pinned budget {fmt_gb(b.pinned_budget_bytes)} ("
                  + (f"{fmt_gb(spare) if spare >= 10**9 else fmt_mib(spare)} to spare" if spare >= 0
                     else f"{fmt_gb(-spare)} over") + f"; binding: {b.binding})", soft_wrap=True)
    else:
        con.print(f"pinned: none (HiCache off); the pinned budget {fmt_gb(b.pinned_budget_bytes)}", soft_wrap=True)
    if (reach := _reach_line(p)) is not None:
        con.print(escape(reach), soft_wrap=True)
    con.print(escape(_next_line(p, command or ["-p", p.profile], host or [])), soft_wrap=True)
    # header lines are not wrapped (soft_wrap): a piped plan keeps its file:line whole
    con.print(f"[bold]{escape(p.profile)}[/]  TP {p.tp_size}, {p.platform} host ({p.host_source}), "
              f"KV {p.kv_cache_dtype}, page {p.page_size}, HiCache {chosen}  ({escape(hc.requested)})", soft_wrap=True)
    con.print(f"SGLang {p.sglang_release} ({escape(p.sglang_release_source or 'the default release')})",
              soft_wrap=True)
    from escha_deploy.utils.termtext import printable

    # the pin quotes the model folder's name and its lock file's repository id
    con.print(f"weights: {p.weights_source} ({escape(printable(p.weights_source_detail))}); "
              f"{escape(printable(p.model_pin or 'unpinned'))}",
              soft_wrap=True)

    t = Table(title="Per rank (GB = 1e9 B)", title_justify="left")
    t.add_column("pool")
    t.add_column("size", justify="right")
    t.add_column("bytes", justify="right", no_wrap=True)
    r = p.per_rank
    t.add_row("device KV", f"{r.device_kv_tokens:,} tokens x {r.device_kv_bytes_per_token:,} B", _b(r.device_kv_bytes))
    if p.hybrid:
        t.add_row("device mamba", f"{r.device_mamba_slots} slots (+1) x {r.mamba_bytes_per_slot:,} B", _b(r.device_mamba_bytes))
    if r.device_int2_hp_bytes:
        t.add_row("device INT2 bf16 arena", "sink + recent windows", _b(r.device_int2_hp_bytes))
    t.add_row("weights", {"headers": "safetensors headers (tensor bytes)", "file sizes": "safetensors file sizes",
                          "estimate": "the profile's estimate (no model folder)"}[p.weights_source], _b(r.weights_bytes))
    if r.draft_weights_bytes:
        t.add_row("draft weights", "loaded before the pools are sized", _b(r.draft_weights_bytes))
    if r.device_draft_kv_bytes:
        t.add_row("draft KV", f"{r.device_kv_tokens:,} tokens x {r.draft_kv_bytes_per_token:,} B", _b(r.device_draft_kv_bytes))
    if hc.enabled:
        t.add_row("host KV (pinned)", f"{r.host_kv_tokens:,} tokens x {r.host_kv_bytes_per_token:,} B", _b(r.host_kv_bytes))
        if p.hybrid:
            t.add_row("host mamba (pinned)", f"{r.host_mamba_slots} slots x {r.mamba_bytes_per_slot:,} B", _b(r.host_mamba_bytes))
        t.add_row("[bold]pinned per rank[/]", "", _b(r.pinned_bytes))
        t.add_row("[bold]pinned total[/]", f"{p.tp_size} ranks", _b(p.pinned_total_bytes))
    con.print(t)
    if r.host_buffers:
        first = r.host_buffers[0]
        t = Table(title="Host buffers per rank: requested and pinned", title_justify="left")
        t.add_column("buffer")
        t.add_column("requested", justify="right", no_wrap=True)
        t.add_column("pinned", justify="right", no_wrap=True)
        for buf in r.host_buffers:
            t.add_row(buf.name, f"{buf.requested_bytes:,} B", f"{buf.pinned_bytes:,} B")
        con.print(t)
        con.print(f"allocator {first.allocator} ({first.allocator_source}); pinned bytes: {first.source}",
                  soft_wrap=True)

    if p.l3_disk is not None:
        from escha_deploy.planner.disk import describe

        con.print(f"file L3 disk: {describe(p.l3_disk)} ({p.l3_disk.source})", soft_wrap=True, markup=False)

    if p.host_tier_reach:
        w = p.host_tier_reach[0]
        t = Table(title=f"host tier: {w.prefixes} x {w.prefix_tokens:,}-token prefixes asked twice, which come back "
                        "(per rank; planner/reach.py)", title_justify="left")
        t.add_column("split", min_width=24, ratio=1)
        for col in ("host KV", "host mamba", "pinned", "back"):
            t.add_column(col, justify="right", no_wrap=True)
        for row in p.host_tier_reach:
            back = {"all": f"{row.restored}/{row.prefixes} at {row.restore_tokens:,}+",
                    "none": "none", "not_guaranteed": "not sure"}[row.verdict]
            t.add_row(escape(row.config), f"{row.host_kv_tokens:,}", f"{row.host_mamba_slots:,}",
                      fmt_gb(row.pinned_bytes_per_rank), back)
        con.print(t)
        con.print(f"both passes of {w.prefixes} prefixes take {w.states_needed:,} host mamba states and "
                  f"{w.kv_tokens_needed:,} host KV tokens; "
                  + "; ".join(f"{escape(r.config.split(':')[0])}: {escape(r.why)}" for r in p.host_tier_reach)
                  + "; not sure: LRU decides (it can return none)", soft_wrap=True)

    hh = p.host_hit_cost
    if hh is not None:
        t = Table(title="host_hit_cost: a cached prefix loaded back from host RAM vs recomputed (per rank)",
                  title_justify="left")
        for col in ("prefix", "load-back", "load", "recompute"):
            t.add_column(col, justify="right")
        for row in hh.rows:
            t.add_row(f"{row.prefix_tokens:,} tokens", f"{row.load_bytes_per_rank:,} B",
                      "not measured" if row.load_s is None else f"{row.load_s * 1e3:,.1f} ms at {row.load_gbps:g} GB/s",
                      "not known" if row.recompute_s is None else f"{row.recompute_s:,.2f} s")
        con.print(t)
        con.print(f"load: {hh.load_source}; recompute: "
                  + (f"{hh.prefill_tokens_per_s:g} tok/s, {hh.prefill_source}" if hh.prefill_tokens_per_s
                     else hh.prefill_source) + f"; bytes: {hh.bytes_rule}", soft_wrap=True)

    t = Table(title="Pinned budget (the profile's safety policy)", title_justify="left")
    # the label keeps a readable width at 80 columns; the long binding explanation in the
    # second column wraps instead of squeezing the labels to nothing
    t.add_column("item", min_width=28, ratio=1)
    t.add_column("bytes", justify="right", ratio=1)
    t.add_row(f"memory base ({b.memory_base_source})", _b(b.memory_base_bytes))
    t.add_row(f"- server processes ({p.tp_size} x {fmt_gib(p.safety_policy.server_process_per_rank_bytes)})", _b(b.server_processes_bytes))
    t.add_row("- OS, Docker, escha-deploy", _b(b.os_reserve_bytes))
    t.add_row("- page-cache floor", _b(b.page_cache_floor_bytes))
    t.add_row("[bold]= pinned budget[/]", _b(b.pinned_budget_bytes))
    if b.pinned_ceiling_bytes is not None:
        t.add_row("pinned ceiling per rank (doctor)", _b(b.pinned_ceiling_bytes))
    t.add_row(f"binding: {b.binding}", b.binding_detail)
    if b.headroom_bytes is not None:
        t.add_row("headroom at the chosen setting", f"{b.headroom_bytes:,} B ({fmt_mib(b.headroom_bytes)})")
    if p.runtime_check is not None:
        t.add_row("MemAvailable when the pools are built (base - OS - processes)",
                  _b(p.runtime_check.available_bytes))
    if b.available_now_bytes is not None:
        t.add_row("MemAvailable now", _b(b.available_now_bytes))
    con.print(t)

    rc = p.runtime_check
    if rc is not None:
        t = Table(title="The runtime's own host-memory check", title_justify="left")
        t.add_column("runtime")
        t.add_column("result")
        t.add_column("why")
        stock_why = rc.stock_detail + (f"; available: {rc.stock_available_detail}" if rc.stock_available_detail else "")
        t.add_row(f"stock {rc.release or p.sglang_release}" + (" (applies)" if rc.applies == "stock" else ""),
                  rc.stock or "-", stock_why)
        patched = (f"patched, reserve {fmt_gib(rc.patched_reserve_bytes)}" if rc.patched is not None
                   else "patched (our series)")  # none for this release: no reserve to hand over
        t.add_row(patched + (" (applies)" if rc.applies == "patched" else ""),
                  rc.patched or "-", rc.patched_detail)
        con.print(t)
    g = p.host_guard
    if g is not None:
        from rich.markup import escape as _esc

        con.print(f"SGLang {g.release}'s host guard ({g.kind}): available {fmt_gib_gb(g.available_bytes)} "
                  f"= {_esc(g.available_detail)}, reserve {fmt_gib(g.reserve_bytes)}, one reading's share per rank "
                  f"{fmt_gib_gb(max(g.share_per_rank_bytes, 0))}", soft_wrap=True)
        if g.auto_size is not None:
            au = g.auto_size
            con.print(f"  its auto-size (not used: escha renders the ratio) would pick ratio {au.ratio:g}"
                      + (" and refuse" if au.refused else "") + f": {_esc(au.detail)}", soft_wrap=True)

    d = p.device
    # the WSL2 term only on WSL2: a plain Linux host hides nothing
    hidden = f"; {fmt_gib(d.hidden_bytes)} hidden by WSL2" if p.platform == "wsl2" else ""
    con.print(f"device: {fmt_gb(d.static_need_bytes)} static need vs {fmt_gb(d.static_budget_bytes)} budget "
              f"(mem_fraction_static {d.mem_fraction_static}, SGLang default {d.sglang_default_mem_fraction_static}"
              f"{hidden}) -> {'fits' if d.fits else '[red]does not fit[/]'}")

    t = Table(title="KV dtype per token per rank", title_justify="left")
    for col in ("dtype", "device B/token", "host B/token", "tokens per GB", "device pool"):
        t.add_column(col, justify="right" if col != "dtype" else "left")
    for row in p.kv_dtype_comparison:
        mark = " *" if row.dtype == p.kv_cache_dtype or (row.dtype == "bf16" and p.kv_cache_dtype in ("auto", "bfloat16")) else ""
        t.add_row(row.dtype + mark, f"{row.device_bytes_per_token:,}",
                  "-" if row.host_bytes_per_token is None else f"{row.host_bytes_per_token:,}",
                  f"{row.tokens_per_gb:,}", fmt_gb(row.device_pool_bytes))
    con.print(t)

    if p.argv_check is not None:
        a = p.argv_check
        con.print(f"argv: {a.verified} flags verified against SGLang {p.sglang_release}'s parser catalog"
                  + (f"; declared by capabilities, not verified: {', '.join(a.declared)}" if a.declared else ""))
    con.print(f"verdict: [bold {colour}]{p.verdict}[/]{short}")
    # reasons quote config sections like [wsl2]: not markup; and a model folder's or a file's
    # names: no terminal controls
    for reason in p.reasons:
        con.print(f"  - {escape(printable(reason))}", soft_wrap=True)
    if p.host_fit is not None:
        con.print(f"  host: {escape(printable(p.host_fit.line))}", soft_wrap=True)
    for w in p.warnings:
        con.print(f"  [yellow]warning[/]: {escape(printable(w))}", soft_wrap=True)
