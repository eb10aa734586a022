"""The bench workload against STAND-IN servers: timing, token accounting, concurrency, and the
source of the cached-token figure."""

from __future__ import annotations

import asyncio

import pytest

from escha_deploy.bench.client import Completion
from escha_deploy.bench.metrics import Snapshot
from escha_deploy.bench.models import ServerFacts, WorkloadSpec
from escha_deploy.bench.prompts import make_prompt
from escha_deploy.bench.workload import bench_endpoint, cached_figure

from .standin_sglang import tokenize as standin_tokenize

SPEC = WorkloadSpec(seed=3, prefixes=4, prefix_tokens=1500, prefill_tokens=5000,
                    decode_tokens=50, answer_tokens=8)
#: A device pool that holds one 1500-token prefix of the 4, so without HiCache the second pass
#: recomputes at least 3 of them (which one may still hit depends on the order the concurrent
#: requests arrive in) and with HiCache at least 3 come back from the host pool.
POOLS = dict(device_tokens=2000, host_tokens=50_000)


def _run(url: str, spec: WorkloadSpec = SPEC):
    return asyncio.run(bench_endpoint(url, spec))


def test_timing_matches_the_modelled_rates(standin):
    srv = standin(prefill_tps=50_000.0, decode_tps=500.0, **POOLS)
    run = _run(srv.url)
    # the stand-in sleeps 5000 / 50,000 s for the prefill and 1/500 s per token; the client
    # adds HTTP time, so measured rates are at most the modelled ones. How far below depends on
    # the machine's load (a shared 2-core box), so the lower bound only catches unit errors
    # (ms for s, tokens for requests): a factor of 20, not a timing claim.
    assert 0.05 * 50_000 <= run.prefill.tokens_per_s <= 1.05 * 50_000
    assert 0.05 * 500 <= run.decode.tokens_per_s <= 1.05 * 500
    assert run.decode.completion_tokens == 50


def test_token_accounting_uses_the_server_tokenizer(standin):
    srv = standin(**POOLS)
    run = _run(srv.url)
    assert run.token_counts == "server tokenizer"
    assert run.prefill.prompt_tokens == SPEC.prefill_tokens

    async def tok(text):
        return standin_tokenize(text)

    expected = 0
    for i in range(SPEC.prefixes):
        p = asyncio.run(make_prompt(SPEC.seed, "prefix", i, SPEC.prefix_tokens, tok, "q1"))
        expected += p.tokens
    assert run.first_pass.prompt_tokens == expected
    assert run.first_pass.requests == SPEC.prefixes


#: For the timing-dependent tests: each prefix holds the stand-in's one GPU for half a second
#: (500 tokens at 1000 tokens/s), far longer than the client needs to send the others even on a
#: loaded 2-core machine; the other phases are kept short.
SLOW = dict(prefill_tps=1000.0, load_back_tps=10_000_000.0)
SLOW_SPEC = WorkloadSpec(seed=3, prefixes=4, prefix_tokens=500, prefill_tokens=50, decode_tokens=4,
                         answer_tokens=2)


def test_prefix_requests_are_concurrent(standin):
    srv = standin(device_tokens=600, host_tokens=50_000, **SLOW)
    _run(srv.url, SLOW_SPEC)
    assert srv.state.max_in_flight >= SLOW_SPEC.prefixes


HICACHE_SPEC = SPEC.model_copy(update={"prefill_tokens": 100, "decode_tokens": 4})


def test_hicache_on_makes_the_second_pass_faster_and_says_why(standin):
    # 1500-token prefixes at 5000 tokens/s: recomputing 3 of them holds the GPU 0.9 s, loading
    # them back takes microseconds; HTTP overhead on a loaded machine stays far below 0.45 s
    off = _run(standin(hicache=False, prefill_tps=5_000.0, **POOLS).url, HICACHE_SPEC)
    on = _run(standin(hicache=True, prefill_tps=5_000.0, **POOLS).url, HICACHE_SPEC)
    assert off.facts.label == "off" and on.facts.label == "on"
    assert on.second_pass.wall_s < off.second_pass.wall_s / 2
    c_off, c_on = off.second_pass.cached, on.second_pass.cached
    assert c_on.source == c_off.source == "usage.prompt_tokens_details.cached_tokens"
    assert c_off.share is not None and c_off.share < 0.3
    assert c_on.share is not None and c_on.share > 0.9
    assert c_on.host_tokens and c_on.host_tokens >= 3 * SPEC.prefix_tokens
    assert c_on.load_back_tokens and c_on.load_back_tokens["kv"] == c_on.host_tokens


@pytest.mark.parametrize(
    "switches, source",
    [
        (dict(cache_report=True), "usage.prompt_tokens_details.cached_tokens"),
        (dict(cache_report=False), "sglext.cached_tokens_details"),
        (dict(cache_report=False, cached_details=False), "metrics:sglang:cached_tokens_total"),
        (dict(cache_report=False, cached_details=False, metrics=False), None),
    ],
)
def test_source_of_the_cached_figure(standin, switches, source):
    run = _run(standin(**POOLS, **switches).url)
    c = run.second_pass.cached
    assert c.source == source
    if source is None:
        assert c.share is None and "--enable-cache-report" in (c.note or "")
    else:
        assert c.share is not None and c.share > 0.9


def test_rerun_with_the_same_seed_warns_that_prompts_were_cached(standin):
    srv = standin(device_tokens=100_000)
    _run(srv.url)
    again = _run(srv.url)
    assert any("same --seed" in w for w in again.warnings)


# ---- cached_figure against known responses ------------------------------------------------

FACTS = ServerFacts(url="http://127.0.0.1:1", model="m", hicache=True)


def _c(prompt, usage=None, details=None):
    return Completion(prompt_tokens=prompt, usage_cached=usage, details=details)


def test_usage_field_missing_reads_as_zero_once_the_server_reports():
    # SGLang omits prompt_tokens_details when the count is 0 (usage_processor._details_if_cached)
    fig = cached_figure([_c(100, usage=90), _c(100)], FACTS, None, None)
    assert (fig.cached_tokens, fig.share) == (90, 0.45)
    fig = cached_figure([_c(100), _c(100)], FACTS.model_copy(update={"cache_report": True}),
                        None, None)
    assert (fig.cached_tokens, fig.source) == (0, "usage.prompt_tokens_details.cached_tokens")


def test_sglext_gives_the_host_split():
    fig = cached_figure([_c(100, details={"device": 10, "host": 80}), _c(100)], FACTS, None, None)
    assert (fig.cached_tokens, fig.source) == (90, "sglext.cached_tokens_details")
    assert (fig.host_tokens, fig.host_source) == (80, "sglext.cached_tokens_details.host")


def test_metrics_delta_when_responses_carry_nothing():
    before = Snapshot({("sglang:cached_tokens_total", (("cache_source", "host"),)): 5.0})
    after = Snapshot({("sglang:cached_tokens_total", (("cache_source", "host"),)): 185.0,
                      ("sglang:cached_tokens_total", (("cache_source", "device"),)): 10.0})
    fig = cached_figure([_c(100), _c(100)], FACTS, before, after)
    assert (fig.cached_tokens, fig.source) == (190, "metrics:sglang:cached_tokens_total")
    assert fig.host_tokens == 180 and fig.note and "every request" in fig.note


def test_a_workload_that_fits_the_device_pool_is_called_out(standin):
    # 4 x 1500 tokens in a 100,000-token device pool: the second pass is all device hits
    for hicache in (False, True):
        run = _run(standin(hicache=hicache, device_tokens=100_000).url)
        assert run.second_pass.cached.share > 0.9
        assert any("host tier was not exercised" in w for w in run.warnings), hicache


def test_a_host_tier_second_pass_is_not_called_out(standin):
    run = _run(standin(hicache=True, **POOLS).url)
    assert not any("not exercised" in w for w in run.warnings)
