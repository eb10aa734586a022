"""Multimodal bytes, planned by SGLang's own rule (``srt/configs/model_config.py:
is_multimodal``; ``srt/mem_cache/kv_cache_configurator.py: mm_runtime_reservation_gb``): a model
folder whose config.json is multimodal gives SGLANG_VLM_CACHE_SIZE_MB (100 MiB) of the KV budget
away, and SGLANG_MM_FEATURE_CACHE_MB (1,024 MiB) more with a GPU feature transport; a text-only
folder plans as before. Real folders; the oracle cases ``multimodal-*`` hold the same against
SGLang's configurator."""

from __future__ import annotations

import json
from pathlib import Path

from escha_deploy.facts.machine import described_host
from escha_deploy.planner import plan
from escha_deploy.profile import load_profile
from escha_deploy.sglang.arch import read_model_dir
from escha_deploy.sglang.multimodal import reservation

MiB = 2**20
TEXT = {"model_type": "qwen3_5_text", "num_hidden_layers": 64, "num_key_value_heads": 4, "head_dim": 256,
        "full_attention_interval": 4, "linear_num_key_heads": 16, "linear_num_value_heads": 48,
        "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
        "hidden_size": 5120, "num_attention_heads": 24}


def _folder(d: Path, config: dict) -> Path:
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    return d


def _plan(folder: Path, *sets: str):
    prof = load_profile("rtx5060ti-tp2-fp8", ["runtime.max_total_tokens=null", "runtime.max_mamba_cache_size=null",
                                              *sets])
    return plan(prof, described_host(32 * 2**30), model_dir=read_model_dir(folder))


def test_a_multimodal_folder_reserves_the_configurators_bytes_and_a_text_only_one_is_unchanged(tmp_path):
    mm = _folder(tmp_path / "vl", {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
                                   "text_config": TEXT, "vision_config": {"depth": 27}})
    text = _folder(tmp_path / "text", {"architectures": ["Qwen3_5ForCausalLM"], **TEXT})
    p_mm, p_text = _plan(mm), _plan(text)
    assert p_mm.device.mm_reservation_bytes == 100 * MiB and p_text.device.mm_reservation_bytes == 0
    assert p_mm.per_rank.device_kv_tokens < p_text.per_rank.device_kv_tokens
    assert any(d.rule == "multimodal reservation per rank" and "Qwen3_5ForConditionalGeneration" in d.reason
               for d in p_mm.decisions)
    # the same plan as with no folder at all, where the profile's architecture stands
    none = plan(load_profile("rtx5060ti-tp2-fp8", ["runtime.max_total_tokens=null",
                                                   "runtime.max_mamba_cache_size=null"]), described_host(32 * 2**30))
    assert (p_text.per_rank.device_kv_tokens, p_text.per_rank.device_mamba_slots) == (
        none.per_rank.device_kv_tokens, none.per_rank.device_mamba_slots)
    ipc = _plan(mm, "runtime.extra_args=[--mm-feature-transport,cuda_ipc]")
    assert ipc.device.mm_reservation_bytes == (100 + 1024) * MiB


def test_the_rule_as_sglang_decides_it():
    q = ("Qwen3_5ForConditionalGeneration",)
    kw = dict(text_subconfig=True, vision_or_audio=True, language_model_only=False)
    assert reservation(q, **kw).bytes == 100 * MiB
    assert reservation(q, **{**kw, "language_model_only": True}).bytes == 0  # config.json's language_model_only
    # Gemma 3 has multimodal off by default with SGLang's own classes, on with --enable-multimodal
    g = ("Gemma3ForConditionalGeneration",)
    assert reservation(g, **kw).bytes == 0
    assert reservation(g, **kw, extra_args=["--enable-multimodal"]).bytes == 100 * MiB
    # a nested text config alone is a multimodal sub-config; vision/audio only count with transformers
    assert reservation(("SomeForConditionalGeneration",), **kw).bytes == 100 * MiB
    flat = dict(text_subconfig=False, vision_or_audio=True, language_model_only=False)
    assert reservation(("LlamaForCausalLM",), **flat).bytes == 0
    assert reservation(("LlamaForCausalLM",), **flat, extra_args=["--model-impl", "transformers"]).bytes == 100 * MiB
    # a later release's list is longer
    b = ("BailingMoeV3VLForConditionalGeneration",)
    assert reservation(b, **flat).bytes == 0 and reservation(b, **flat, release="0.5.23").bytes == 100 * MiB
