"""Speculative acceptance before and after host hits (sglang#32176: after HiCache filled and
loaded back, EAGLE's acceptance length fell 4.49 -> 1.59 with no error).

Exposition pairs made by prometheus_client with SGLang's own series (the stand-in server's
metrics, ``sglang:spec_accept_length`` added with SchedulerMetricsCollector's labels, as every
supported release's ``metrics.json`` defines it), parsed as ``status`` and the canary parse a
scrape: acceptance falling 4.5 -> 1.6 while ``load_back_tokens_total`` rises fires the alert
and the canary's warning; a stable pair, a fall without load-backs, or HiCache off does not.
"""

from __future__ import annotations

import pytest

from bench.standin_sglang import StandinConfig, _Metrics
from escha_deploy.bench.canary import acceptance_evidence
from escha_deploy.bench.metrics import SPEC_ACCEPT_LENGTH, Snapshot
from escha_deploy.sglang.releases import supported_releases
from escha_deploy.watch import alerts as al
from escha_deploy.watch.names import release_metrics
from escha_deploy.watch.reading import server_reading, server_window
from escha_deploy.watch.render import render_row


class _Box:
    """One stand-in server's metrics, with the speculative gauge SGLang exports per scheduler."""

    def __init__(self, hicache: bool = True) -> None:
        from prometheus_client import Gauge

        self.m = _Metrics(StandinConfig(hicache=hicache, hybrid=False))
        sched = list(self.m.ranks[0])
        self.spec = Gauge(SPEC_ACCEPT_LENGTH, "Mean acceptance length of speculative decoding.", sched,
                          registry=self.m.registry)

    def look(self, accept: float, load_back: int = 0) -> Snapshot:
        self.m.set_all(self.spec, accept)
        self.m.radix(self.m.load_back, load_back, pool="kv")
        return Snapshot.parse(self.m.text().decode())


def _pair(before: float, after: float, load_back: int, hicache: bool = True) -> tuple[Snapshot, Snapshot]:
    box = _Box(hicache)
    return box.look(before), box.look(after, load_back)


def _alert(old: Snapshot, new: Snapshot) -> al.Evaluation:
    w = server_window(server_reading(new), server_reading(old), 60.0)
    return al.evaluate(server=w, host=None, host_win=None, plan=None, endpoint="http://127.0.0.1:30000")


def test_the_name_is_sglangs_in_every_supported_release():
    for v in supported_releases():
        assert release_metrics(v)[SPEC_ACCEPT_LENGTH]["type"] == "Gauge", v


def test_acceptance_falling_after_load_backs_fires_and_a_stable_pair_does_not():
    fell = _alert(*_pair(4.5, 1.6, 12_000))
    a = next(a for a in fell.alerts if a.id == "spec_acceptance_fell")
    assert "sglang:spec_accept_length 4.50 -> 1.60 (-64 %)" in a.evidence
    assert "sglang:load_back_tokens_total +12,000" in a.evidence
    assert "sglang#32176" in a.fix and "canary --endpoint http://127.0.0.1:30000" in a.fix
    stable = _alert(*_pair(4.5, 4.4, 12_000))
    assert "spec_acceptance_fell" not in [a.id for a in stable.alerts]
    assert "spec_acceptance_fell" not in stable.not_evaluated


@pytest.mark.parametrize("before,after,load_back,hicache", [
    (4.5, 1.6, 0, True),  # fell, but nothing came back from the host: not this
    (4.5, 1.6, 12_000, False),  # no host tier
    (0.0, 0.0, 12_000, True),  # no speculative decoding (SGLang's gauge stays 0.0)
])
def test_no_alert_without_load_backs_a_host_tier_or_speculative_decoding(before, after, load_back, hicache):
    ev = _alert(*_pair(before, after, load_back, hicache))
    assert "spec_acceptance_fell" not in [a.id for a in ev.alerts]


def test_status_shows_acceptance_before_and_after_the_window():
    from rich.console import Console

    from escha_deploy.watch.report import server_section

    old, new = _pair(4.5, 1.6, 12_000)
    w = server_window(server_reading(new), server_reading(old), 60.0)
    section = server_section(w, None)
    assert section["window"]["spec_accept_length"] == {"before": 4.5, "after": 1.6, "load_back_tokens": 12_000}
    row = {"profile": "p", "endpoint": "http://127.0.0.1:30000", "plan_digest": None, "uptime_s": 60,
           "server": section, "alerts": [], "plan": None}
    console = Console(width=400, record=True)
    console.print(render_row(row))
    text = console.export_text()
    assert "speculative acceptance over 60 s: sglang:spec_accept_length 4.50 -> 1.60 (-64 %)" in text


def test_the_canary_reports_acceptance_before_and_after_its_host_hit():
    fell = acceptance_evidence(*_pair(4.5, 1.6, 12_000))
    assert fell[0].endswith("sglang:spec_accept_length 4.50 -> 1.60 (-64 %) while "
                            "sglang:load_back_tokens_total +12,000")
    assert len(fell) == 2 and "sglang#32176" in fell[1]
    stable = acceptance_evidence(*_pair(4.5, 4.4, 12_000))
    assert len(stable) == 1 and "4.50 -> 4.40" in stable[0]
    assert acceptance_evidence(*_pair(0.0, 0.0, 12_000)) == []  # no speculative decoding: nothing said
