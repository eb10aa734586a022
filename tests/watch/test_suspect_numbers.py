"""Figures a server sends that cannot be true are named, never trusted in silence: a share
outside 0-100 %, a counter that goes backwards without a restart, more cached than prompt
tokens, a series given twice, samples after ``# EOF``. Each is one line in the view and the
``implausible_numbers`` alert (``status --check`` exit 3). Parsed from Prometheus text by the
real parser (``prometheus_client``), as ``status`` reads it."""

from __future__ import annotations

import pytest

from escha_deploy.bench.metrics import Snapshot
from escha_deploy.watch.alerts import evaluate
from escha_deploy.watch.reading import server_reading, server_window


def _reading(requests: float, prompt: float, cached: float, evicted: float = 0.0, extra: str = ""):
    return server_reading(Snapshot.parse(
        "# TYPE sglang:num_requests_total counter\n"
        f"sglang:num_requests_total {requests}\n"
        "# TYPE sglang:prompt_tokens_total counter\n"
        f"sglang:prompt_tokens_total {prompt}\n"
        "# TYPE sglang:cached_tokens_total counter\n"
        f'sglang:cached_tokens_total{{cache_source="device"}} {cached}\n'
        "# TYPE sglang:evicted_tokens_total counter\n"
        f'sglang:evicted_tokens_total{{tp_rank="0"}} {evicted}\n'
        "# TYPE sglang:token_usage gauge\n"
        'sglang:token_usage{tp_rank="0"} 0.5\n' + extra))


def _alerts(w) -> list[str]:
    return [a.id for a in evaluate(server=w, host=None, host_win=None, plan=None).alerts]


def test_sane_figures_raise_nothing():
    w = server_window(_reading(10, 1000, 400, 5), _reading(5, 500, 200, 2), 5.0)
    assert w.suspect == [] and "implausible_numbers" not in _alerts(w)


def test_a_counter_that_goes_backwards_without_a_restart_is_named():
    w = server_window(_reading(10, 1000, 400, evicted=3), _reading(5, 500, 200, evicted=90), 5.0)
    assert len(w.suspect) == 1
    assert "went backwards while the request count did not" in w.suspect[0]
    assert "rank 0: evicted tokens 90 -> 3" in w.suspect[0]
    assert "implausible_numbers" in _alerts(w)


def test_a_restart_sets_every_counter_back_and_is_not_suspect():
    w = server_window(_reading(2, 100, 40, 1), _reading(50, 5000, 2000, 90), 5.0)
    assert w.suspect == [] and w.requests == 2


def test_more_cached_than_prompt_tokens_in_the_window():
    w = server_window(_reading(10, 1000, 900), _reading(5, 900, 100), 5.0)
    assert any("800 cached prompt tokens in the window, more than its 100 prompt" in x for x in w.suspect)


@pytest.mark.parametrize("extra, words", [
    ('sglang:token_usage{tp_rank="0"} 0.7\n', 'series given twice or more (the last value read): '
                                              'sglang:token_usage{tp_rank="0"}'),
    ('# EOF\nsglang:num_queue_reqs{tp_rank="0"} 3\n', "1 samples after '# EOF'"),
    ('# TYPE sglang:mamba_usage gauge\nsglang:mamba_usage{tp_rank="1"} -3\n',
     "rank 1: mamba use (sglang:mamba_usage) is -300 %, outside 0-100 %"),
])
def test_one_scrape_that_cannot_be_true(extra, words):
    r = _reading(1, 10, 1, extra=extra)
    assert [x for x in r.suspect if words in x], r.suspect
    assert "implausible_numbers" in _alerts(server_window(r, None, None))


def test_many_suspect_figures_are_capped_at_six_lines():
    extra = "# TYPE sglang:mamba_usage gauge\n" + "".join(
        f'sglang:mamba_usage{{tp_rank="{i}"}} 9\n' for i in range(20))
    r = _reading(1, 10, 1, extra=extra)
    assert len(r.suspect) == 6 and r.suspect[-1] == "and 15 more suspect figures"
