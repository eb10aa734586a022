"""The alerts of a running box: each rule, its evidence (the numbers it read and where from)
and the fix. Pure: readings and windows in, ``Alert`` list out.

Thresholds are ``Thresholds`` fields, set by the profile's ``watch`` section; the defaults and
their sources are in ``profile.thresholds``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from escha_deploy.launch.planview import PlanView
from .reading import HostReading, HostWindow, ServerWindow, rank_name
from escha_deploy.profile.thresholds import Thresholds

GB = 1e9

#: cgroup v2 ``memory.events`` keys that mean the limit was hit (cgroup-v2.rst): ``high``
#: (throttled above memory.high), ``max`` (reclaim at memory.max), ``oom``, ``oom_kill``.
MEMORY_EVENTS = ("high", "max", "oom", "oom_kill")


class Alert(BaseModel):
    """One alert: ``id`` is stable (scripts match on it), ``evidence`` the numbers and their
    source, ``fix`` the next thing to do."""

    model_config = ConfigDict(frozen=True)
    id: str
    title: str
    evidence: str
    fix: str


class Evaluation(BaseModel):
    alerts: list[Alert] = Field(default_factory=list)
    not_evaluated: dict[str, str] = Field(default_factory=dict, description="alert id -> why")


def _n(x: float) -> str:
    return f"{x:,.0f}"


def _gb(b: float) -> str:
    return f"{b / GB:.2f} GB"


def _pools(d: dict[str, float]) -> str:
    return " / ".join(f"+{_n(v)} {k}" for k, v in sorted(d.items())) or "+0"


def inert_host_tier(w: ServerWindow, th: Thresholds, endpoint: str | None = None) -> Alert | str:
    """The host tier is filled and never read: over >= ``inert_min_requests`` finished
    requests (``num_requests_total``) with cached prompt tokens among them (SGLang counts no
    requests-with-a-hit; ``cached_tokens_total`` rose), ``hicache_backup_tokens_total`` and
    ``evicted_tokens_total`` rose and ``hicache_host_used_tokens`` > 0, while
    ``load_back_tokens_total`` and ``cached_tokens_total{cache_source="host"}`` stayed flat.
    Returns why it was not evaluated, as a string, when the window cannot say."""
    if not w.hicache:
        return "HiCache is off (no sglang:hicache_host_total_tokens)"
    if w.requests < th.inert_min_requests or w.cached_total <= 0:
        return (f"{_n(w.requests)} requests, {_n(w.cached_total)} cached tokens in the window; "
                f"needs {th.inert_min_requests} requests that reuse a prefix")
    backup = {k: sum(r.backup_tokens.get(k, 0.0) for r in w.ranks.values())
              for r0 in w.ranks.values() for k in r0.backup_tokens}
    evicted = sum(r.evicted_tokens for r in w.ranks.values())
    used = sum(r.now.host_used_tokens or 0 for r in w.ranks.values())
    total = sum(r.now.host_total_tokens or 0 for r in w.ranks.values())
    load = {k: sum(r.load_back_tokens.get(k, 0.0) for r in w.ranks.values())
            for r0 in w.ranks.values() for k in r0.load_back_tokens}
    host_hits = w.cached_tokens.get("host", 0.0)
    if not (sum(backup.values()) > 0 and evicted > 0 and used > 0
            and sum(load.values()) == 0 and host_hits == 0):
        return ""
    ranks = ", ".join(rank_name(r) for r in w.ranks)
    return Alert(
        id="inert_host_tier", title="host tier allocated and never hit",
        evidence=(f"over {_n(w.requests)} requests with {_n(w.cached_total)} cached tokens "
                  f"({ranks} summed): hicache_backup_tokens_total {_pools(backup)}, "
                  f"evicted_tokens_total +{_n(evicted)}, hicache_host_used_tokens {_n(used)} of "
                  f"{_n(total)}, but load_back_tokens_total {_pools(load)} and "
                  f'cached_tokens_total{{cache_source="host"}} +0'),
        fix=("evicted prefixes reach host memory and are never loaded back. On a hybrid model a "
             "prefix comes back only up to a node that still holds a mamba state, and under "
             "write_through every backed-up prefill chunk takes one host mamba slot, of which "
             "there are int(max_mamba_cache_size x hicache_ratio) + 1 (SGLang 0.5.19 "
             "pool_host/mamba.py: MambaPoolHost); more distinct prefixes x chunks than that, asked "
             "in the order they were filled, get none back (docs/planner.md, \"When a hybrid "
             "model's prefix can come back from the host tier\"; sglang#39436). Fewer states per "
             "prefix (a larger runtime.chunked_prefill_size) or more host mamba slots (a larger "
             "hicache.hicache_ratio, within the plan's budget) move it; prove it with "
             f"`escha-deploy canary --endpoint {endpoint or 'URL'}`, or give the host RAM back "
             "(`--set hicache.enabled=false`). The patched image does not change this path."))


def spec_acceptance_fell(w: ServerWindow, endpoint: str | None = None) -> Alert | str:
    """Speculative acceptance fell after host load-backs while HiCache is on: the acceptance
    length (``spec_accept_length``) at the window's end is more than ``SPEC_ACCEPT_FALL`` below
    its start while ``load_back_tokens_total`` rose (sglang#32176: EAGLE's 4.49 fell to 1.59
    after HiCache filled and loaded back, with no error; flushing the cache restored it)."""
    from escha_deploy.bench.metrics import acceptance_fell, acceptance_text

    if w.spec_accept_after is None or not w.hicache:
        return ""  # no speculative decoding, or no host tier: nothing to watch
    if w.spec_accept_before is None:
        return "needs sglang:spec_accept_length above 0 in two looks (a window with a start)"
    loaded = w.load_back_total
    if loaded <= 0 or not acceptance_fell(w.spec_accept_before, w.spec_accept_after):
        return ""
    return Alert(
        id="spec_acceptance_fell", title="speculative acceptance fell after host load-backs",
        evidence=acceptance_text(w.spec_accept_before, w.spec_accept_after, loaded)
        + (f" over {w.seconds:.0f} s" if w.seconds else ""),
        fix=("sglang#32176: after HiCache filled and loaded prefixes back from the host, EAGLE's acceptance "
             "length fell from 4.49 to 1.59 with no error, and flushing the cache restored it. Check the "
             f"answers with `escha-deploy canary --endpoint {endpoint or 'URL'}`; flush the cache (SGLang's "
             "POST /flush_cache) to confirm, and run with the host tier off (`--set hicache.enabled=false`) "
             "until a release fixes it"))


def page_cache_low(host: HostReading, plan: PlanView | None) -> Alert | str:
    """Page cache (``Active(file) + Inactive(file)``) under the plan's page-cache floor."""
    if plan is None or plan.page_cache_floor_bytes <= 0:
        return "no plan figures (started by this escha-deploy?)"
    if host.page_cache_bytes is None:
        return "/proc/meminfo has no Active(file)/Inactive(file)"
    if host.page_cache_bytes >= plan.page_cache_floor_bytes:
        return ""
    avail = f", MemAvailable {_gb(host.mem_available_bytes)}" if host.mem_available_bytes is not None else ""
    return Alert(
        id="page_cache_low", title="page cache under the plan's floor",
        evidence=(f"page cache {_gb(host.page_cache_bytes)} (/proc/meminfo Active(file) + "
                  f"Inactive(file)) under the floor {_gb(plan.page_cache_floor_bytes)}{avail}"),
        fix=("the pinned host pools and the processes leave too little for file pages: lower "
             "hicache.hicache_ratio (`escha-deploy plan` recommends one) or stop what else uses memory; "
             "the floor is safety.page_cache_floor"))


def swapping(hw: HostWindow | None, th: Thresholds) -> Alert | str:
    """Swap pages in + out per second over the window above ``swap_pages_per_s``."""
    if hw is None or hw.swap_in_pages_per_s is None or hw.swap_out_pages_per_s is None:
        return "needs two readings of /proc/vmstat pswpin/pswpout"
    rate = hw.swap_in_pages_per_s + hw.swap_out_pages_per_s
    if rate <= th.swap_pages_per_s:
        return ""
    return Alert(
        id="swapping", title="the host is swapping",
        evidence=(f"swap in {hw.swap_in_pages_per_s:,.1f} + out {hw.swap_out_pages_per_s:,.1f} "
                  f"pages/s over {hw.seconds:.0f} s (/proc/vmstat pswpin, pswpout) > "
                  f"{th.swap_pages_per_s:g}"),
        fix=("pinned pools cannot be swapped, so everything else is: lower hicache.hicache_ratio until "
             "MemAvailable stays above the plan's reserves (`escha-deploy plan`)"))


def memory_pressure(host: HostReading, th: Thresholds) -> Alert | str:
    """Memory PSI ``some avg10`` (host, or the server's cgroup, the higher) over the threshold."""
    cands = [(host.psi, "/proc/pressure/memory")]
    if host.cgroup and host.cgroup.psi:
        cands.append((host.cgroup.psi, f"cgroup {host.cgroup.path} memory.pressure"))
    cands = [(p, where) for p, where in cands if p is not None]
    if not cands:
        return "memory PSI not available (no /proc/pressure/memory)"
    psi, where = max(cands, key=lambda c: c[0].some_avg10)
    if psi.some_avg10 <= th.psi_some_avg10:
        return ""
    return Alert(
        id="memory_pressure", title="tasks stall on memory",
        evidence=f"memory PSI some avg10 {psi.some_avg10:.1f} % ({where}) > {th.psi_some_avg10:g} %",
        fix=("the box reclaims memory continuously: lower hicache.hicache_ratio or stop what else uses "
             "memory; systemd-oomd kills at 60 % by default"))


def memory_event(hw: HostWindow | None, host: HostReading | None, container_events: list[str],
                 oom_killed: bool) -> Alert | str:
    """A memory-high, memory-max or OOM event of the server's cgroup in the window
    (``memory.events``), an ``oom`` event from Docker, or ``State.OOMKilled``."""
    seen = [f"memory.events {k} +{v}" for k, v in (hw.cgroup_events if hw else {}).items()
            if k in MEMORY_EVENTS]
    if ooms := sum(1 for e in container_events if e == "oom"):
        seen.append(f"docker event oom x{ooms}")
    if oom_killed:
        seen.append("docker State.OOMKilled")
    if not seen:
        return ""
    where = f" (cgroup {host.cgroup.path})" if host and host.cgroup else ""
    return Alert(
        id="memory_event", title="the server's memory limit was hit",
        evidence=", ".join(seen) + where,
        fix=("the cgroup's memory.high/memory.max is below what the server uses: raise the "
             "container's memory limit or plan under it (`escha-deploy plan` reads the cgroup "
             "limit as the memory base)"))


def kv_dropped(w: ServerWindow) -> Alert | str:
    """Device KV freed without a host backup (``hicache_dropped_tokens_total`` rose)."""
    rows = [f'{rank_name(r)}: {{reason/pool="{k}"}} +{_n(v)}' for r, rw in w.ranks.items()
            for k, v in sorted(rw.dropped_tokens.items()) if v > 0]
    if not rows:
        return ""
    return Alert(
        id="kv_dropped", title="device KV dropped without a host backup",
        evidence="hicache_dropped_tokens_total " + "; ".join(rows),
        fix=("write-back backups failed under host memory pressure (SGLang 0.5.19 "
             "hiradix_cache.py, reason host_pressure): use hicache.hicache_write_policy write_through "
             "or lower hicache.hicache_ratio"))


def load_back_slower_than_recompute(w: ServerWindow, plan: PlanView | None,
                                    prefill_tokens_per_s: float | None = None) -> Alert | str:
    """Loading a KV token back takes longer than recomputing it: the window's copy seconds per
    loaded-back KV token (``load_back_duration_seconds_sum`` / ``load_back_tokens_total``)
    against one over the prefill rate (tokens/s: the argument, else the plan's measured one)."""
    rate = prefill_tokens_per_s or (plan.prefill_tokens_per_s if plan else None)
    if not rate:
        return ("no prefill rate: bench's cold prefill or hicache.prefill_tokens_per_s (plan's host_hit_cost), "
                "or --prefill-tps")
    where = "--prefill-tps" if prefill_tokens_per_s else plan.prefill_source
    recompute = 1.0 / rate
    slow = []
    for r, rw in w.ranks.items():
        spt = rw.load_back_seconds_per_token
        if spt is not None and spt > recompute:
            gbps = rw.load_back_gb_per_s
            ref = f" against {plan.h2d_bytes_per_s / GB:.1f} GB/s measured" if plan and plan.h2d_bytes_per_s else ""
            slow.append(f"{rank_name(r)}: {_n(rw.load_back_tokens.get('kv', 0))} KV tokens loaded back in "
                        f"{rw.load_back_seconds:.3f} s ({spt * 1e6:.1f} us/token"
                        + (f", {gbps:.2f} GB/s{ref}" if gbps else "") + ")")
    if not slow:
        return ""
    return Alert(
        id="load_back_slower_than_recompute", title="loading back costs more than recomputing",
        evidence="; ".join(slow) + f"; prefill recomputes at {rate:,.0f} tokens/s ({recompute * 1e6:.1f} us/token, "
                 f"{where})",
        fix=("the host -> device path is slow (unpinned host memory, a narrow PCIe link): "
             "`escha-deploy doctor` measures it; try hicache.hicache_io_backend kernel, or turn the "
             "host tier off"))


def implausible_numbers(w: ServerWindow) -> Alert | str:
    """The server's figures contradict themselves or their ranges (``reading.suspect_numbers``,
    ``reading.backwards``): no alert built on them can be trusted, so this is one."""
    if not w.suspect:
        return ""
    return Alert(id="implausible_numbers", title="the server's figures cannot be true",
                 evidence="; ".join(w.suspect),
                 fix="read /metrics by hand (curl URL/metrics): a proxy or exporter between "
                     "escha-deploy and SGLang, or a second server on the port, can give such figures")


def evaluate(*, server: ServerWindow | None, host: HostReading | None, host_win: HostWindow | None,
             plan: PlanView | None, th: Thresholds = Thresholds(),
             container_events: list[str] = (), oom_killed: bool = False,
             prefill_tokens_per_s: float | None = None, endpoint: str | None = None) -> Evaluation:
    """Every rule over one look; rules whose inputs are missing go to ``not_evaluated``."""
    ev = Evaluation()
    results: list[tuple[str, Alert | str]] = []
    if server is not None:
        results += [("implausible_numbers", implausible_numbers(server)),
                    ("inert_host_tier", inert_host_tier(server, th, endpoint)), ("kv_dropped", kv_dropped(server)),
                    ("load_back_slower_than_recompute",
                     load_back_slower_than_recompute(server, plan, prefill_tokens_per_s)),
                    ("spec_acceptance_fell", spec_acceptance_fell(server, endpoint))]
    if host is not None:
        results += [("page_cache_low", page_cache_low(host, plan)),
                    ("memory_pressure", memory_pressure(host, th))]
    results += [("swapping", swapping(host_win, th)),
                ("memory_event", memory_event(host_win, host, list(container_events), oom_killed))]
    for rid, res in results:
        if isinstance(res, Alert):
            ev.alerts.append(res)
        elif res:
            ev.not_evaluated[rid] = res
    return ev
