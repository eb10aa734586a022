"""Stage 6 of SGLang's own pre-flight (escha_deploy/launch/sglang_preflight.py: ``_model_runner``)
against the real SGLang wheels, on 0.5.19 and 0.5.23: the checks SGLang's ``ModelRunner`` makes
when it builds the attention backend, on the plan's card, refuse what SGLang's code refuses there
with its message and file:function, and build what it builds.

Runs as tests/launch/test_sglang_preflight.py does (the flag-catalog venvs, the test-only site
hook tests/launch/preflight_cpu_site); this file's argvs run in one SGLang process per release
(tests/launch/sglang_preflight_cases.py: ``SharedPreflight``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from escha_deploy.launch import sglang_preflight as pf

from .sglang_preflight_cases import RELEASE_SIZING, Cases, model_folder, rendered, shares_process

pytestmark = pytest.mark.wheel

#: SGLang's refusals when its model runner builds the attention backend for the fp8 profile's
#: hybrid GDN model on its sm_120 card (``layers/attention/attention_registry.py``; the same code in
#: 0.5.19 and 0.5.23), by ``--attention-backend``: (type, message, file:function). fa3's factory
#: refuses before the wrapper is reached; fa4's factory builds, and the wrapper refuses it.
RUNNER_REFUSALS = {
    "fa3": ("AssertionError", "FlashAttention v3 Backend requires SM>=80 and SM<=90",
            "srt/layers/attention/attention_registry.py:create_flashattention_v3_backend"),
    "fa4": ("AssertionError", "backends are supported on Blackwell GPUs for hybrid GDN models. Got prefill=fa4, "
            "decode=fa4", "srt/layers/attention/attention_registry.py:attn_backend_wrapper"),
}


def backend_cases(cli, tmp_path: Path, release: str) -> Cases:
    """The fp8 profile on ``release`` with fa3, fa4, triton and flashinfer on its sm_120 card, and
    fa3 and fa4 again on an sm_89 card (the capability alone changed)."""
    base, dev = rendered(cli, "rtx5060ti-tp2-fp8", model_folder(tmp_path, "rtx5060ti-tp2-fp8"),
                         f"runtime.sglang_version={release}")
    assert dev["capability"] == "12.0", dev
    c = Cases()
    for b in ("fa3", "fa4", "triton", "flashinfer"):
        c.add(b, [*base, "--attention-backend", b], dev)
    for b in ("fa3", "fa4"):
        c.add(f"{b} on sm_89", c.argvs[b][0], {**dev, "capability": "8.9"})
    return c


@shares_process(backend_cases)
@pytest.mark.parametrize("release", sorted(RELEASE_SIZING))
def test_model_runner_stage_refuses_the_attention_backend_sglang_refuses_on_the_card(preflight, release):
    """Stage 6 (``_model_runner``) runs SGLang's own attention-backend construction checks without
    weights, on the plan's compute capability (``hardware.compute_capability`` 12.0 for
    ``rtx5060ti-tp2-fp8``): fa3 and fa4 are refused with SGLang's message and site, naming
    ``--attention-backend``; triton and flashinfer build the hybrid linear-attention backend over
    the model's 16 full-attention layers; on an sm_89 card (the capability alone changed) fa3 and
    fa4 pass the same checks, so the card's capability is what refuses them."""
    results = preflight.results
    for b, (typ, message, site) in RUNNER_REFUSALS.items():
        r = results[b]
        assert (r.ok, r.stage, r.type, r.site, r.fault) == (False, "model runner", typ, site, ""), (b, r)
        assert message in r.message and r.flags == ["--attention-backend"], (b, r)
        assert "attention_registry.py" in pf.refusal_line(r, pf.profile_keys_for(r.flags, []))
    for b in ("triton", "flashinfer"):
        r = results[b]
        assert r.ok is True and r.stage == "model runner", (b, r)
        built = {"triton": "TritonAttnBackend", "flashinfer": "FlashInferAttnBackend"}[b]
        assert r.answers["model_runner_backend"] == f"HybridLinearAttnBackend({built}, GDNAttnBackend, " \
                                                    "16 full-attention layers)", r.answers
    for b in ("fa3", "fa4"):
        r = results[f"{b} on sm_89"]
        assert r.ok is True and r.stage == "model runner", (b, r)
        assert r.answers["model_runner_backend"].startswith("HybridLinearAttnBackend(FlashAttentionBackend, "), r.answers


#: The cards whose GDN prefill default reads the mamba pool's dtype (compute capabilities)
GDN_CARDS = ("9.0", "10.0")


def gdn_prefill_cases(cli, tmp_path: Path, release: str) -> Cases:
    """The fp8 profile on ``release`` with triton, on each of ``GDN_CARDS``."""
    folder = model_folder(tmp_path, "rtx5060ti-tp2-fp8")
    config = json.loads((folder / "config.json").read_text())
    text = config.get("text_config", config)
    assert (text["linear_key_head_dim"], text["linear_value_head_dim"]) == (128, 128), text
    base, dev = rendered(cli, "rtx5060ti-tp2-fp8", folder, f"runtime.sglang_version={release}",
                         "runtime.attention_backend=triton")
    c = Cases()
    for card in GDN_CARDS:
        c.add(card, base, {**dev, "capability": card})
    return c


@shares_process(gdn_prefill_cases)
@pytest.mark.parametrize("release", sorted(RELEASE_SIZING))
def test_model_runner_stage_gives_the_gdn_prefill_default_the_mamba_pools_dtype(preflight, release):
    """On sm_90 and sm_100 SGLang's choice of the GDN prefill kernel
    (``linear/gdn_backend.py: flashinfer_gdn_prefill_default``) reads the device mamba pool's
    state dtype off the model runner (``req_to_token_pool.mamba_pool.mamba_cache.temporal``) for a
    model with 128-wide linear heads, as the fp8 profile's is. Stage 6 stands the card in for that
    function too and gives its runner the pool's states in the dtypes SGLang allocates
    (``_mamba_pool_states``): both cards build the hybrid backend. Without the states the stage
    failed on an H200 ('SimpleNamespace' object has no attribute 'req_to_token_pool', reported as
    SGLang refusing the attention backend); on this CPU machine the function never got that far,
    because it read the missing CUDA device itself."""
    for card in GDN_CARDS:
        r = preflight.results[card]
        assert r.ok is True and r.stage == "model runner" and not r.fault, (card, r)
        assert r.answers["model_runner_backend"].startswith("HybridLinearAttnBackend(TritonAttnBackend, "
                                                            "GDNAttnBackend, "), (card, r.answers)


def trtllm_page_cases(cli, tmp_path: Path, release: str) -> Cases:
    """The fp8 profile on ``release`` with trtllm_mha and bf16 KV: 4 or 24 query heads, page 128
    or 64, an sm_100 or sm_90 card."""
    folders = {}
    for heads in (4, 24):
        (tmp_path / str(heads)).mkdir()
        folders[heads] = model_folder(tmp_path / str(heads), "rtx5060ti-tp2-fp8", num_attention_heads=heads)

    def case(heads: int, page: int, capability: str) -> tuple[list[str], dict[str, int]]:
        """What serve --print renders with 24 query heads (a plan that passes), on ``heads``'s folder."""
        base, dev = rendered(cli, "rtx5060ti-tp2-fp8", folders[24], f"runtime.sglang_version={release}",
                             "runtime.attention_backend=trtllm_mha", f"runtime.page_size={page}",
                             f"hardware.compute_capability=\"{capability}\"", "runtime.kv_cache.dtype=bf16")
        assert dev["capability"] == capability and base[base.index("--page-size") + 1] == str(page), (base, dev)
        return [str(folders[heads]) if x == str(folders[24]) else x for x in base], dev

    c = Cases()
    c.add("gqa 2/2 on sm_100", *case(4, 128, "10.0"))
    c.add("gqa 12/2 on sm_100", *case(24, 128, "10.0"))
    c.add("page 64 on sm_100", *case(4, 64, "10.0"))
    c.add("xqa on sm_90", *case(4, 128, "9.0"))
    return c


@shares_process(trtllm_page_cases)
@pytest.mark.parametrize("release", sorted(RELEASE_SIZING))
def test_model_runner_stage_runs_trtllm_mhas_page_check_on_the_model_config(preflight, release):
    """Stage 6 runs ``TRTLLMHAAttnBackend.__init__``'s own page-size statements (compiled from
    SGLang's file; the constructor itself takes the device pools) on the resolved page size, the
    model folder's config.json and the card: page 128 with trtllm_mha on sm_100 (no XQA kernels)
    and 4 query heads over 4 KV heads at TP 2 is refused with SGLang's message, at its file and
    function, naming --page-size; 24 query heads, page 64, or an sm_90 card (XQA) build it."""
    results = preflight.results
    r = results["gqa 2/2 on sm_100"]
    assert (r.ok, r.stage, r.type, r.site, r.fault) == (
        False, "model runner", "ValueError", "srt/layers/attention/trtllm_mha_backend.py:__init__", ""), r
    assert "trtllm_mha with page_size=128 requires trtllm-gen's dynamic tokens-per-page kernels" in r.message, r
    assert "got 2/2" in r.message and r.flags == ["--page-size"], r
    assert "runtime.page_size" in pf.refusal_line(r, pf.profile_keys_for(r.flags, []))
    for case in ("gqa 12/2 on sm_100", "page 64 on sm_100", "xqa on sm_90"):
        r = results[case]
        assert r.ok is True and r.stage == "model runner", (case, r)
        assert r.answers["model_runner_backend"].startswith("HybridLinearAttnBackend(TRTLLMHAAttnBackend, "), r.answers
