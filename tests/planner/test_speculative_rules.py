"""Speculative decoding and torch.compile on a hybrid GDN model: the refusals and warnings the plan
makes for what SGLang 0.5.19 starts but serves wrongly or slowly (sglang#36537, sglang#35777)."""

from __future__ import annotations

import json

import pytest

PROFILE = ("-p", "rtx5060ti-tp2-fp8", "--host-ram", "24GiB")


def _plan(cli, *sets: str):
    args = [a for s in sets for a in ("--set", s)]
    r = cli("plan", *PROFILE, *args, "-f", "json")
    return r, json.loads(r.out) if r.out.strip() else None


@pytest.mark.parametrize("alg", ["NEXTN", "EAGLE", "eagle3"])
def test_explicit_extra_buffer_with_eagle_style_speculation_is_refused(cli, alg):
    r, d = _plan(cli, f"runtime.speculative.algorithm={alg.upper()}",
                 "runtime.mamba_radix_cache_strategy=extra_buffer")
    assert r.code == 3, r.err
    line = next(x for x in d["reasons"] if x.startswith("runtime.mamba_radix_cache_strategy:"))
    assert "sglang#36537" in line and "mamba_radix_cache_strategy: extra_buffer_lazy" in line


def test_auto_with_speculation_renders_extra_buffer_lazy_with_a_decision(cli):
    spec = "runtime.speculative.algorithm=NEXTN"
    r, d = _plan(cli, spec, "runtime.mamba_radix_cache_strategy=auto")
    assert r.code == 0, r.err
    dec = [x for x in d["decisions"] if x["rule"] == "mamba radix cache strategy"]
    assert dec and dec[0]["value"] == "--mamba-radix-cache-strategy extra_buffer_lazy" and "sglang#36537" in dec[0]["reason"]
    out = cli("serve", "--print", *PROFILE[:2], "--set", spec, "--set", "runtime.mamba_radix_cache_strategy=auto").out
    argv = json.loads(out)["argv"] if out.lstrip().startswith("{") else out.split()
    i = argv.index("--mamba-radix-cache-strategy")
    assert argv[i + 1] == "extra_buffer_lazy"


def test_auto_without_speculation_is_left_to_sglang(cli):
    r, d = _plan(cli, "runtime.mamba_radix_cache_strategy=auto")
    assert r.code == 0 and not [x for x in d["decisions"] if x["rule"] == "mamba radix cache strategy"]
    out = cli("serve", "--print", *PROFILE[:2], "--set", "runtime.mamba_radix_cache_strategy=auto").out
    assert "--mamba-radix-cache-strategy" not in out


def test_the_draft_model_is_said_to_be_outside_the_plan(cli):
    r, d = _plan(cli, "runtime.speculative.algorithm=NEXTN",
                 "runtime.mamba_radix_cache_strategy=extra_buffer_lazy")
    assert r.code == 0, r.err
    assert any("draft model's weights and KV cache are not in this plan" in w for w in d["warnings"]), d["warnings"]


def test_torch_compile_with_decode_graphs_on_a_hybrid_model_is_warned(cli):
    r, d = _plan(cli, 'runtime.extra_args=["--enable-torch-compile"]')
    assert r.code == 0, r.err
    assert any("sglang#35777" in w for w in d["warnings"]), d["warnings"]
    r, d = _plan(cli, 'runtime.extra_args=["--enable-torch-compile", "--disable-cuda-graph"]')
    assert not any("sglang#35777" in w for w in d["warnings"])


def test_ngram_with_pages_and_flex_attention_are_refused_as_sglang_refuses():
    """SGLang's ``_handle_ngram`` gives NGRAM the top-k ``--speculative-ngram-max-bfs-breadth`` (10)
    and refuses it above 1 with pages above 1 outside flashinfer; ``attention_hook.py`` asserts no
    speculation with flex_attention (both on 0.5.19 and 0.5.23). The fuzz found both as misses."""
    from escha_deploy.facts.machine import described_host
    from escha_deploy.planner import plan
    from escha_deploy.profile import load_profile
    from escha_deploy.utils.units import GiB

    def reasons(*sets):
        return plan(load_profile("linux-tp2-l3", ["runtime.needs=[]", *sets]), described_host(256 * GiB)).reasons

    ngram = ["runtime.speculative.algorithm=NGRAM", "runtime.mamba_radix_cache_strategy=auto"]
    assert any("_handle_ngram" in r and "page size 64" in r for r in reasons(*ngram))
    assert not any("_handle_ngram" in r for r in reasons(*ngram, "runtime.attention_backend=flashinfer"))
    assert not any("_handle_ngram" in r for r in reasons(
        *ngram, "runtime.extra_args=[--speculative-ngram-max-bfs-breadth, '1']"))
    flex = reasons("runtime.speculative.algorithm=NEXTN", "runtime.attention_backend=flex_attention")
    assert any("flex_attention" in r and "attention_hook.py" in r for r in flex)
