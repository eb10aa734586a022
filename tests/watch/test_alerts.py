"""Each alert fires on its condition and stays quiet without it (pure: readings in, alerts out),
and the window arithmetic (shares, GB/s, restarts) that the alerts and the view rest on."""

from __future__ import annotations

from pathlib import Path

import pytest

from escha_deploy.watch import alerts as al
from escha_deploy.watch.collect import read_host
from escha_deploy.launch.planview import PlanView
from escha_deploy.watch.reading import (HostReading, RankReading, ServerReading, host_window,
                                        server_window)

FIX = Path(__file__).parent / "fixtures"
PLAN = PlanView(profile="p", tp_size=1, hicache_enabled=True, host_kv_tokens=200_000,
                host_kv_bytes=200_000 * 4096, page_cache_floor_bytes=4_000_000_000)

# the field evidence of an inert host tier on stock 0.5.19 (a hybrid model, TP4)
INERT = dict(backup_tokens={"kv": 32_700, "mamba": 16}, evicted_tokens=40_000, host_used_tokens=32_700,
             host_total_tokens=200_000, load_back_tokens={"kv": 0, "mamba": 0})
HEALTHY = dict(INERT, load_back_tokens={"kv": 12_000, "mamba": 8}, load_back_bytes=12_000 * 4096,
               load_back_seconds=0.01)


def srv(rank: dict, *, requests=100, cached=None, hicache=True, ranks=("0",)) -> ServerReading:
    return ServerReading(hicache=hicache, requests=requests, prompt_tokens=100_000,
                         cached_tokens={"device": 20_000} if cached is None else cached,
                         ranks={r: RankReading(**rank) for r in ranks})


def window(rank: dict, **kw):
    return server_window(srv(rank, **kw), None, None)


def ids(ev: al.Evaluation) -> list[str]:
    return [a.id for a in ev.alerts]


@pytest.mark.parametrize("rank,kw,fires", [
    (INERT, {}, True),
    (INERT, dict(ranks=("0", "1", "2", "3")), True),
    (HEALTHY, {}, False),  # it loads back
    (INERT, dict(cached={"device": 20_000, "host": 5}), False),  # host hits counted
    (dict(INERT, backup_tokens={}), {}, False),  # nothing backed up
    (dict(INERT, evicted_tokens=0), {}, False),  # nothing evicted: no reason to load back
    (dict(INERT, host_used_tokens=0), {}, False),  # host pool empty
    (INERT, dict(requests=19), False),  # too few requests to say
    (INERT, dict(cached={}), False),  # no reuse at all: nothing to load back
    (INERT, dict(hicache=False), False),
])
def test_inert_host_tier(rank, kw, fires):
    got = al.inert_host_tier(window(rank, **kw), al.Thresholds())
    assert isinstance(got, al.Alert) is fires
    if fires:
        assert "load_back_tokens_total +0 kv / +0 mamba" in got.evidence
        n = len(kw.get("ranks", ("0",)))
        assert f"+{32_700 * n:,} kv / +{16 * n} mamba" in got.evidence and "sglang#39436" in got.fix
        # the advice names what moves it (SGLang's host mamba pool, docs/planner.md), not the
        # patched image, whose series does not change the hybrid restore path
        assert "host mamba slot" in got.fix and "runtime.chunked_prefill_size" in got.fix
        assert "hicache.hicache_ratio" in got.fix and "build --hicache" not in got.fix


@pytest.mark.parametrize("below", [True, False])
def test_inert_either_side_of_its_request_threshold(below):
    """At ``inert_min_requests`` - 1 the window cannot say (a reason, no alert); at the threshold
    the same readings fire."""
    th = al.Thresholds()
    got = al.inert_host_tier(window(INERT, requests=th.inert_min_requests - (1 if below else 0)), th)
    assert isinstance(got, al.Alert) is (not below)
    if below:
        assert f"needs {th.inert_min_requests} requests" in got


def test_inert_threshold_is_a_parameter():
    assert isinstance(al.inert_host_tier(window(INERT, requests=5), al.Thresholds(inert_min_requests=5)), al.Alert)


@pytest.mark.parametrize("dropped,fires", [({"host_pressure/kv": 0.0, "host_pressure/mamba": 0.0}, False),
                                           ({"host_pressure/kv": 1234.0}, True)])
def test_kv_dropped(dropped, fires):
    got = al.kv_dropped(window(dict(HEALTHY, dropped_tokens=dropped)))
    assert isinstance(got, al.Alert) is fires
    if fires:
        assert 'reason/pool="host_pressure/kv"} +1,234' in got.evidence


@pytest.mark.parametrize("seconds,rate,fires", [
    (0.01, 20_000.0, False),  # 0.83 us/token loading vs 50 us recomputing
    (1.2, 20_000.0, True),  # 100 us/token loading vs 50 us recomputing
    (1.2, None, None),  # no prefill rate: not evaluated
])
def test_load_back_slower_than_recompute(seconds, rate, fires):
    w = window(dict(HEALTHY, load_back_seconds=seconds))
    got = al.load_back_slower_than_recompute(w, PLAN, rate)
    if fires is None:
        assert isinstance(got, str) and "prefill rate" in got
    else:
        assert isinstance(got, al.Alert) is fires


def test_load_back_rate_from_the_plan():
    w = window(dict(HEALTHY, load_back_seconds=1.2))
    plan = PLAN.model_copy(update={"prefill_tokens_per_s": 20_000.0, "h2d_bytes_per_s": 25e9})
    got = al.load_back_slower_than_recompute(w, plan)
    assert isinstance(got, al.Alert) and "25.0 GB/s measured" in got.evidence


@pytest.mark.parametrize("page_cache,floor,fires", [
    (589_000_000, 4_000_000_000, True), (5_000_000_000, 4_000_000_000, False), (589_000_000, 0, None)])
def test_page_cache_low(page_cache, floor, fires):
    got = al.page_cache_low(HostReading(page_cache_bytes=page_cache),
                            PLAN.model_copy(update={"page_cache_floor_bytes": floor}))
    if fires is None:
        assert isinstance(got, str) and "no plan figures" in got
    else:
        assert isinstance(got, al.Alert) is fires and (fires or got == "")


def test_host_alerts_on_the_fixture_trees():
    """The pressed box (the seed's figures) raises page cache, swap, PSI and memory events; the
    calm one, read the same way, raises none."""
    for name, expect in (("calm", []), ("pressed", ["page_cache_low", "memory_pressure", "swapping",
                                                    "memory_event"])):
        a = read_host([4242], FIX / (name if name == "calm" else "pressed-0"))
        b = read_host([4242], FIX / (name if name == "calm" else "pressed-1"))
        ev = al.evaluate(server=None, host=b, host_win=host_window(b, a, 10.0), plan=PLAN)
        assert ids(ev) == expect, (name, ev)
        if name == "pressed":
            by = {x.id: x for x in ev.alerts}
            assert "page cache 0.59 GB" in by["page_cache_low"].evidence
            assert "swap in 300.0 + out 500.0 pages/s" in by["swapping"].evidence
            assert "40.0 %" in by["memory_pressure"].evidence  # the cgroup's, higher than the host's
            assert "memory.events high +17, memory.events oom +1, memory.events oom_kill +1" in by["memory_event"].evidence


@pytest.mark.parametrize("th,fires", [(al.Thresholds(swap_pages_per_s=1000), False),
                                      (al.Thresholds(swap_pages_per_s=799), True)])
def test_swap_threshold(th, fires):
    a, b = read_host([4242], FIX / "pressed-0"), read_host([4242], FIX / "pressed-1")
    assert isinstance(al.swapping(host_window(b, a, 10.0), th), al.Alert) is fires


def test_missing_psi_is_not_evaluated_not_zero():
    ev = al.evaluate(server=None, host=HostReading(psi=None), host_win=None, plan=PLAN)
    assert "memory_pressure" in ev.not_evaluated and "not available" in ev.not_evaluated["memory_pressure"]


@pytest.mark.parametrize("events,oom_killed,fires", [([], False, False), (["start", "oom"], False, True),
                                                      ([], True, True), (["die"], False, False)])
def test_docker_memory_events(events, oom_killed, fires):
    assert isinstance(al.memory_event(None, None, events, oom_killed), al.Alert) is fires


def test_shares_and_bandwidth():
    old = srv(HEALTHY, cached={"device": 100, "host": 0}, requests=10)
    new_rank = dict(HEALTHY, load_back_bytes=HEALTHY["load_back_bytes"] + 8e9,
                    load_back_seconds=HEALTHY["load_back_seconds"] + 0.5)
    new = srv(new_rank, cached={"device": 400, "host": 900, "storage_file": 100}, requests=30)
    w = server_window(new, old, 10.0)
    assert w.requests == 20 and w.share("device") == pytest.approx(300 / 1300)
    assert w.share("host") == pytest.approx(900 / 1300) and w.share("storage") == pytest.approx(100 / 1300)
    assert w.ranks["0"].load_back_gb_per_s == pytest.approx(16.0)  # 8 GB in 0.5 s


def test_a_restart_counts_from_zero():
    old = srv(dict(HEALTHY, evicted_tokens=50_000), requests=500)
    new = srv(dict(HEALTHY, evicted_tokens=100), requests=3)
    w = server_window(new, old, 5.0)
    assert (w.requests, w.ranks["0"].evicted_tokens) == (3, 100)


def test_no_cached_tokens_has_no_share():
    assert window(HEALTHY, cached={}).share("host") is None


def test_watch_thresholds_are_profile_fields_outside_the_plan_digest():
    """``watch.*`` reaches the alerts through the plan view, and changing it changes no
    digest: a threshold is no reason to replace a running server."""
    from escha_deploy.facts.machine import described_host
    from escha_deploy.pipeline.spec import build_launch_spec
    from escha_deploy.planner import plan
    from escha_deploy.profile import load_profile
    from escha_deploy.utils.units import GiB
    from escha_deploy.launch.planview import plan_view

    digests = []
    for sets in ([], ["watch.inert_min_requests=5", "watch.psi_some_avg10=50"]):
        prof = load_profile("rtx5060ti-tp2", sets)
        p = plan(prof, described_host(16 * GiB, "wsl2"))
        digests.append(build_launch_spec(p, prof).plan_digest)
        view = plan_view(p, digests[-1], prof.watch)
    assert digests[0] == digests[1]
    assert (view.thresholds.inert_min_requests, view.thresholds.psi_some_avg10) == (5, 50.0)


def test_host_mamba_states_are_read_when_exported():
    """SGLang 0.5.23's host mamba gauges (per rank), absent on 0.5.19 (None, shown as '-')."""
    from escha_deploy.bench.metrics import Snapshot
    from escha_deploy.watch.reading import server_reading

    lab = 'model_name="m",engine_type="unified",pp_rank="0",moe_ep_rank="0"'
    text = "".join(f"# TYPE sglang:{n} gauge\n" + "".join(f'sglang:{n}{{{lab},tp_rank="{r}"}} {v + r}\n' for r in (0, 1))
                   for n, v in (("hicache_host_mamba_used_states", 30), ("hicache_host_mamba_total_states", 33),
                                ("hicache_host_total_tokens", 420008)))
    got = server_reading(Snapshot.parse(text))
    assert (got.ranks["1"].host_mamba_used_states, got.ranks["1"].host_mamba_total_states) == (31, 34)
    only_kv = "# TYPE sglang:hicache_host_total_tokens" + text.split("# TYPE sglang:hicache_host_total_tokens")[1]
    old = server_reading(Snapshot.parse(only_kv))  # what 0.5.19 exports
    assert set(old.ranks) == {"0", "1"} and all(r.host_mamba_total_states is None for r in old.ranks.values())


def test_restore_cost_inputs_come_from_the_plan():
    """The plan's host_hit_cost (the profile's hicache.prefill_tokens_per_s here; no restore
    probe on a described host) feeds the load-back-vs-recompute rule, its source named."""
    from escha_deploy.facts.machine import described_host
    from escha_deploy.planner import plan
    from escha_deploy.profile import load_profile
    from escha_deploy.utils.units import GiB
    from escha_deploy.launch.planview import plan_view

    p = plan(load_profile("rtx5060ti-tp2", ["hicache.prefill_tokens_per_s=20000"]), described_host(16 * GiB, "wsl2"))
    view = plan_view(p)
    assert view.prefill_tokens_per_s == 20_000 and "hicache.prefill_tokens_per_s" in view.prefill_source
    assert view.h2d_bytes_per_s is None and view.h2d_source.startswith("not measured")
    got = al.load_back_slower_than_recompute(window(dict(HEALTHY, load_back_seconds=1.2)), view)
    assert isinstance(got, al.Alert) and "us/token, hicache.prefill_tokens_per_s" in got.evidence
    assert al.load_back_slower_than_recompute(window(HEALTHY), view) == ""
