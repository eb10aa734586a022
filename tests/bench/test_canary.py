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
from escha_deploy.bench.models import ServerFacts
from escha_deploy.errors import BadInput

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
    srv = standin(**POOLS)
    r = _canary(srv.url, CanaryOptions(seed=5, prompt_tokens=2000, answer_tokens=16,
                                       fill_tokens=1000, fill_prompt_tokens=1000))
    assert r.verdict == "inconclusive" and "--fill-tokens" in r.reason


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
    # 210,000-token device pool (DESIGN section 5), 4,096-token canary: 205,904 + 21,000
    f = plan_fill(FACTS, CanaryOptions())
    assert f.requests == 14 and f.prompt_tokens == 16_384
    assert f.total_tokens >= 210_000 - 4096 + 21_000
    # ratio 1 under write_through cannot hold canary + fill: said up front
    assert any("host pool" in n for n in f.notes)
    roomy = FACTS.model_copy(update={"hicache_ratio": 1.45})
    assert not plan_fill(roomy, CanaryOptions()).notes


def test_fill_covers_the_mamba_slots():
    f = plan_fill(FACTS.model_copy(update={"max_mamba_cache_size": 16}), CanaryOptions())
    assert f.requests == 17


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
