"""The host-tier restore canary against STAND-IN servers: matching, diverging (sglang#39830),
unprovable (no host hit: sglang#33713, or no cache report), device-path divergence, and the
exit codes (pass 0, mismatch 3, inconclusive 5)."""

from __future__ import annotations

import asyncio
import json

import pytest

from escha_deploy.bench.canary import (
    ISSUE_33713,
    ISSUE_39830,
    CanaryOptions,
    canary_endpoint,
    plan_fill,
)
from escha_deploy.bench.metrics import Snapshot
from escha_deploy.bench.models import ServerFacts
from escha_deploy.utils.errors import BadInput

#: Device pool of 20K tokens, host pool of 80K: a 2K canary, filled out with 4K prompts.
POOLS = dict(device_tokens=20_000, host_tokens=80_000)
OPTS = CanaryOptions(seed=5, prompt_tokens=2000, answer_tokens=16, fill_prompt_tokens=4000)


def _canary(url: str, opts: CanaryOptions = OPTS):
    return asyncio.run(canary_endpoint(url, opts))


def test_pass_needs_and_shows_a_host_tier_hit(standin):
    srv = standin(**POOLS)
    r = _canary(srv.url)
    assert r.verdict == "pass", r.reason
    host = r.answers[2]
    assert host.label == "host" and host.host_tokens and host.host_tokens >= 1900
    assert any("sglext.cached_tokens_details.host" in e for e in r.evidence)
    assert any("load_back_tokens_total" in e for e in r.evidence)
    assert r.answers[0].text == r.answers[1].text == r.answers[2].text
    # evicted by filling, never by a flush (which clears the host tier too)
    assert "/flush_cache" not in srv.state.paths


def test_pass_on_metrics_alone(standin):
    srv = standin(cache_report=False, cached_details=False, **POOLS)
    r = _canary(srv.url)
    assert r.verdict == "pass"
    assert r.answers[2].host_tokens is None and r.answers[2].host_metric_tokens


def test_diverging_host_restore_is_a_mismatch_naming_39830(standin):
    r = _canary(standin(corrupt_host_restore=True, **POOLS).url)
    assert r.verdict == "mismatch" and r.upstream == ISSUE_39830
    assert "sglang#39830" in r.reason
    assert r.answers[0].text == r.answers[1].text != r.answers[2].text


def test_device_path_divergence_is_not_blamed_on_the_host_tier(standin):
    r = _canary(standin(corrupt_device_hit=True, **POOLS).url)
    assert r.verdict == "mismatch" and "device" in r.reason and "39830" not in r.reason


def test_zero_host_hits_on_a_hybrid_model_is_inconclusive_naming_33713(standin):
    r = _canary(standin(prune_on_evict=True, hybrid=True, **POOLS).url)
    assert r.verdict == "inconclusive" and r.upstream == ISSUE_33713
    assert r.hybrid is True and "sglang#33713" in r.reason


def test_no_cache_report_at_all_is_inconclusive_never_pass(standin):
    srv = standin(cache_report=False, cached_details=False, metrics=False, **POOLS)
    r = _canary(srv.url)
    assert r.verdict == "inconclusive" and "--enable-metrics" in r.reason


def test_prefix_still_on_the_device_is_inconclusive(standin):
    """Too small a fill, bounded: the verdict names the evictions the server counted."""
    srv = standin(**POOLS)
    r = _canary(srv.url, CanaryOptions(seed=5, prompt_tokens=2000, answer_tokens=16,
                                       fill_tokens=1000, fill_prompt_tokens=1000, max_fill_requests=3))
    assert r.verdict == "inconclusive" and r.fill_requests == 3
    assert "the device pool evicted 0 tokens per rank while 3000 filler tokens went through it" in r.reason
    assert "--max-fill-requests" in r.reason


def test_the_fill_goes_on_until_the_server_counts_the_canarys_eviction(standin):
    """A fill too small for the pool (1,000 of 20,000 tokens) is repeated, round after round,
    until sglang:evicted_tokens_total says the canary's tokens left: PASS on the first run."""
    srv = standin(**POOLS)
    r = _canary(srv.url, CanaryOptions(seed=5, prompt_tokens=2000, answer_tokens=16,
                                       fill_tokens=1000, fill_prompt_tokens=1000))
    assert r.verdict == "pass", r.reason
    assert 17 <= r.fill_requests <= 23 and any("filling again" in e for e in r.evidence)


@pytest.mark.parametrize("tp", [1, 2])
def test_default_canary_passes_first_on_a_fresh_standin_at_the_real_servers_sizes(standin, tp):
    """The H200 tiny server's pools (2,048 device tokens, host 4,097, page 1): the default
    canary (half the pool: 1,024 tokens), as the first requests after ready, reaches the host tier."""
    srv = standin(device_tokens=2048, host_tokens=4097, tp_size=tp)
    r = _canary(srv.url, CanaryOptions())
    assert r.verdict == "pass", (r.reason, r.evidence)
    assert 1024 <= r.answers[0].prompt_tokens < 1100  # the prefix and the question after it


def test_the_canary_prefix_is_sized_from_the_pool():
    from escha_deploy.bench.canary import canary_tokens

    assert canary_tokens(FACTS, CanaryOptions()) == 4096
    small = FACTS.model_copy(update={"max_total_num_tokens": 2048, "page_size": 64})
    assert canary_tokens(small, CanaryOptions()) == 1024
    assert canary_tokens(small, CanaryOptions(prompt_tokens=300)) == 300


def test_hicache_off_is_refused(cli, standin):
    res = cli("canary", "--endpoint", standin(hicache=False).url)
    assert res.code == 3
    assert "--enable-hierarchical-cache" in res.err


@pytest.mark.parametrize(
    "switches, code, needle",
    [
        ({}, 0, "PASS"),
        (dict(corrupt_host_restore=True), 3, "sglang#39830"),
        (dict(prune_on_evict=True), 5, "sglang#33713"),
    ],
)
def test_cli_exit_codes(cli, standin, switches, code, needle):
    srv = standin(**POOLS, **switches)
    res = cli("canary", "-e", srv.url, "--prompt-tokens", "2000", "--answer-tokens", "16",
              "--seed", "5")
    assert res.code == code, res.err
    assert needle in res.out + res.err
    if code:
        errors = [line for line in res.err.splitlines() if line.startswith("error:")]
        assert len(errors) == 1


def test_cli_json_parses_and_carries_the_verdict(cli, standin):
    srv = standin(corrupt_host_restore=True, **POOLS)
    res = cli("canary", "-e", srv.url, "--prompt-tokens", "2000", "--format", "json")
    assert res.code == 3
    data = json.loads(res.out)
    assert data["verdict"] == "mismatch" and [a["label"] for a in data["answers"]] == [
        "cold", "device", "host"]


# ---- plan_fill (pure) --------------------------------------------------------------------

FACTS = ServerFacts(url="http://127.0.0.1:1", model="m", hicache=True,
                    max_total_num_tokens=210_000, max_req_input_len=131_072,
                    hicache_ratio=1.0, hicache_write_policy="write_through")


def test_fill_for_the_reference_box_pool():
    # 210,000-token device pool (DESIGN section 5): the whole pool + 21,000, in 16,384-token prompts
    f = plan_fill(FACTS, CanaryOptions())
    assert f.requests == 15 and f.prompt_tokens == 15_400 and f.asks == 1  # 231,000 split evenly
    assert f.total_tokens >= 210_000 + 21_000
    # ratio 1 under write_through cannot hold canary + fill: said up front
    assert any("host pool" in n for n in f.notes) and "host pool 210000 tokens" in f.host_short
    roomy = FACTS.model_copy(update={"hicache_ratio": 1.45})
    assert not plan_fill(roomy, CanaryOptions()).notes


def test_fill_covers_the_mamba_slots():
    f = plan_fill(FACTS.model_copy(update={"max_mamba_cache_size": 16}), CanaryOptions())
    assert f.requests == 17


def test_fill_for_the_real_h200_tiny_server():
    """What the real 0.5.19 server of the GPU rig reported (tests/gpu_rig/h200-tiny.yaml: 2,048
    device tokens, 16 mamba slots, page 1, host 4,097): its canary of 1,000 tokens was
    inconclusive with a fill of 'pool less the canary' (1,258 tokens); the whole pool is filled now."""
    facts = ServerFacts(url="http://127.0.0.1:1", model="m", hicache=True, max_total_num_tokens=2048,
                        max_req_input_len=4000, host_pool_tokens=4097, hicache_write_policy="write_through",
                        max_mamba_cache_size=16, page_size=1, eviction_policy="lru", tp_size=1)
    f = plan_fill(facts, CanaryOptions(prompt_tokens=1000))
    assert f.requests == 17 and f.total_tokens >= 2048 + 205 and f.asks == 1 and f.host_short is None


@pytest.mark.parametrize("policy,asks", [("lru", 1), ("priority", 1), ("lfu", 3), ("slru", 3), ("newer", 3)])
def test_fill_asks_each_filler_as_the_eviction_policy_needs(policy, asks):
    f = plan_fill(FACTS.model_copy(update={"eviction_policy": policy, "hicache_ratio": 2.0}), CanaryOptions())
    assert f.asks == asks
    assert (policy == "newer") == any("'newer' is not one the canary knows" in n for n in f.notes)


def test_fill_prompts_are_whole_pages():
    f = plan_fill(FACTS.model_copy(update={"page_size": 64, "max_mamba_cache_size": 40}), CanaryOptions())
    assert f.prompt_tokens % 64 == 0 and f.requests == 41


def test_evictions_are_counted_per_rank():
    """0.5.19 sums every rank's evictions into one series (no tp_rank): divided by tp_size."""
    from escha_deploy.bench.canary import evicted_per_rank

    before = Snapshot.parse('sglang:evicted_tokens_total{cache_type="UnifiedRadixCache"} 100.0\n')
    after = Snapshot.parse('sglang:evicted_tokens_total{cache_type="UnifiedRadixCache"} 2100.0\n')
    tp2 = FACTS.model_copy(update={"tp_size": 2})
    assert evicted_per_rank(after, before, tp2) == 1000
    ranked = Snapshot.parse('sglang:evicted_tokens_total{cache_type="U",tp_rank="0"} 1100.0\n'
                            'sglang:evicted_tokens_total{cache_type="U",tp_rank="1"} 1100.0\n')
    assert evicted_per_rank(ranked, Snapshot.parse(""), tp2) == 1100
    assert evicted_per_rank(Snapshot.parse(""), Snapshot.parse(""), tp2) == 0  # no eviction yet: no series


def test_fill_needs_a_pool_size_or_an_explicit_size():
    with pytest.raises(BadInput, match="--fill-tokens"):
        plan_fill(FACTS.model_copy(update={"max_total_num_tokens": None}), CanaryOptions())
    f = plan_fill(FACTS.model_copy(update={"max_total_num_tokens": None}),
                  CanaryOptions(fill_tokens=50_000))
    assert f.total_tokens >= 50_000


def test_fill_is_bounded():
    with pytest.raises(BadInput, match="--max-fill-requests"):
        plan_fill(FACTS, CanaryOptions(max_fill_requests=4))


def test_up_canary_progress_lines_have_one_prefix(standin, capsys):
    """``up --canary``'s steps, against a STAND-IN server: "canary: cold ask", never
    "canary: canary: cold ask"."""
    from escha_deploy.cli.up import _canary as up_canary
    from escha_deploy.profile import load_profile

    srv = standin(**POOLS)
    up_canary(srv.url, load_profile("rtx5060ti-tp2-fp8"))  # `up` hands it the profile it loaded
    err = capsys.readouterr().err
    assert "canary: cold ask" in err and "canary: canary:" not in err


def test_canary_command_progress_lines_have_one_prefix(standin, cli):
    """`escha-deploy canary`'s progress lines (not a terminal: plain lines), against a STAND-IN
    server, read "canary: cold ask", never "canary: canary: cold ask"."""
    srv = standin(**POOLS)
    r = cli("canary", "-e", srv.url, "--prompt-tokens", "2000", "--fill-tokens", "30000")
    assert "canary: cold ask" in r.err and "canary: canary:" not in r.err, r.err
