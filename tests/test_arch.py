"""Architecture facts the planner needs, checked against SGLang 0.5.19's rules and the seed."""

import json

import pytest

from escha_deploy.utils.errors import BadInput

from escha_deploy.sglang.arch import ModelArch, arch_from_config, kv_heads_per_rank, rank_shapes, read_model_dir

SEED = dict(model_type="qwen3_5_text", num_hidden_layers=64, num_key_value_heads=4, head_dim=256,
            full_attention_interval=4, linear_num_key_heads=16, linear_num_value_heads=48,
            linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4)


def test_seed_model_per_rank_shapes():
    s = rank_shapes(ModelArch(**SEED), tp=2)
    assert (s.full_layers, s.linear_layers, s.kv_heads_per_rank) == (16, 48, 2)
    # conv state 5120 x 3 bf16 and temporal state 24 x 128 x 128 fp32 per layer per rank
    assert s.mamba_conv_bytes_per_layer == 5120 * 3 * 2
    assert s.mamba_temporal_bytes_per_layer == 24 * 128 * 128 * 4
    assert s.mamba_bytes_per_slot == 76_972_032  # the reference box (16 GiB WSL2, two 12 GiB RTX 5060 Ti, TP 2, INT2 KV, ratio 2)


def test_layer_typing_follows_full_attention_interval():
    a = ModelArch(**{**SEED, "num_hidden_layers": 48})
    assert a.full_attention_layer_ids() == list(range(3, 48, 4))  # 3, 7, ..., 47
    assert len(a.linear_layer_ids()) == 36


def test_bf16_ssm_halves_the_temporal_state():
    s = rank_shapes(ModelArch(**{**SEED, "mamba_ssm_dtype": "bfloat16"}), tp=2)
    assert s.mamba_bytes_per_slot == 48 * (5120 * 3 * 2 + 24 * 128 * 128 * 2)


@pytest.mark.parametrize("heads,tp,expected", [(4, 2, 2), (2, 2, 1), (2, 4, 1), (1, 2, 1), (8, 2, 4)])
def test_kv_heads_are_replicated_when_fewer_than_tp(heads, tp, expected):
    assert kv_heads_per_rank(heads, tp) == expected


def test_config_json_with_nested_text_config(tmp_path):
    cfg = {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
           "text_config": {**{k: v for k, v in SEED.items()}, "num_attention_heads": 24, "hidden_size": 5120},
           "vision_config": {"depth": 27}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "model-00001.safetensors").write_bytes(b"\0" * 1000)
    (tmp_path / "model-00002.safetensors").write_bytes(b"\0" * 24)
    facts = read_model_dir(tmp_path)
    assert facts.arch == ModelArch(**SEED, hidden_size=5120)
    assert facts.safetensors_bytes == 1024


def test_hybrid_config_without_interval_is_refused():
    cfg = {k: v for k, v in SEED.items() if k != "full_attention_interval"}
    with pytest.raises(ValueError, match="full_attention_interval"):
        arch_from_config(cfg)


def test_plain_transformer_has_kv_in_every_layer():
    a = arch_from_config({"model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32,
                          "num_key_value_heads": 8, "hidden_size": 4096})
    s = rank_shapes(a, 2)
    assert (a.is_hybrid, a.head_dim, s.full_layers, s.kv_heads_per_rank, s.mamba_bytes_per_slot) == (False, 128, 32, 4, 0)


def test_missing_model_dir_is_none(tmp_path):
    assert read_model_dir(tmp_path / "nope") is None


def test_bad_config_json_names_the_line(tmp_path):
    (tmp_path / "config.json").write_text('{\n "a": 1,\n}')
    with pytest.raises(BadInput, match=r"config.json:3: the model's config.json is not JSON"):
        read_model_dir(tmp_path)
