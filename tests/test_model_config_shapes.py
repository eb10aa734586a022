"""config.json shapes and types: every content is one line naming the file and the field, exit 2,
never a traceback; and the context length SGLang derives from it
(``srt/utils/hf_transformers/common.py: get_context_length``)."""

from __future__ import annotations

import json

import pytest

from escha_deploy.sglang.arch import arch_from_config, derived_context_length

DENSE = {"model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
         "hidden_size": 4096, "head_dim": 128}


@pytest.mark.parametrize("content, message", [
    ([1, 2], "expected a JSON object at the top level (got a list)"),
    ("qwen", "expected a JSON object at the top level (got the string 'qwen')"),
    (5, "expected a JSON object at the top level (got the number 5)"),
    (None, "expected a JSON object at the top level (got null)"),
    ({**DENSE, "text_config": [1]}, "text_config: expected an object (got a list)"),
    ({**DENSE, "num_hidden_layers": "64"}, "num_hidden_layers: expected an integer (got the string '64')"),
    ({**DENSE, "num_hidden_layers": 64.0}, "num_hidden_layers: expected an integer (got the number 64.0)"),
    ({**DENSE, "num_key_value_heads": True}, "num_key_value_heads: expected an integer (got true)"),
    ({"text_config": {**DENSE, "head_dim": "128"}}, "text_config.head_dim: expected an integer (got the string '128')"),
    ({**DENSE, "max_position_embeddings": "32k"},
     "max_position_embeddings: expected an integer (got the string '32k')"),
    ({**DENSE, "model_type": 7}, "model_type: expected a string (got the number 7)"),
    ({**DENSE, "rope_scaling": "yarn"}, "rope_scaling: expected an object or null (got the string 'yarn')"),
    ({**DENSE, "rope_scaling": {"factor": "4"}}, "rope_scaling.factor: expected a number (got the string '4')"),
    ({**DENSE, "num_hidden_layers": 0}, "num_hidden_layers: input should be greater than 0 (got the number 0)"),
    # head_dim 0 fell back to hidden_size // num_attention_heads and was planned
    ({**DENSE, "head_dim": 0}, "head_dim: input should be greater than 0 (got the number 0)"),
    ({"text_config": {**DENSE, "head_dim": -128}}, "text_config.head_dim: input should be greater than 0 (got the number -128)"),
    ({**DENSE, "num_attention_heads": 0}, "num_attention_heads: input should be greater than 0 (got the number 0)"),
    ({**DENSE, "num_key_value_heads": 0}, "num_key_value_heads: input should be greater than 0 (got the number 0)"),
    ({**DENSE, "hidden_size": 0}, "hidden_size: input should be greater than 0 (got the number 0)"),
    ({**DENSE, "max_position_embeddings": 0}, "max_position_embeddings: input should be greater than 0 (got the number 0)"),
    ({**DENSE, "full_attention_interval": 0}, "full_attention_interval: input should be greater than 0 (got the number 0)"),
    ({**DENSE, "linear_conv_kernel_dim": 1}, "linear_conv_kernel_dim: input should be greater than 1 (got the number 1)"),
])
def test_wrong_shapes_and_types_are_one_line_naming_the_field(content, message):
    with pytest.raises(ValueError) as exc:
        arch_from_config(content)
    assert str(exc.value) == message


@pytest.mark.parametrize("extra, expected", [
    ({"max_position_embeddings": 32768}, (32768, "max_position_embeddings")),
    # the first of CONTEXT_LENGTH_KEYS present wins, before max_position_embeddings
    ({"seq_length": 8192, "max_position_embeddings": 32768}, (8192, "seq_length")),
    ({"max_position_embeddings": 32768, "rope_scaling": {"type": "yarn", "factor": 4.0}},
     (131072, "max_position_embeddings x rope_scaling.factor 4")),
    # rope scaling that names the original length, or llama3's, keeps the factor at 1
    ({"max_position_embeddings": 131072, "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768}},
     (131072, "max_position_embeddings")),
    ({"max_position_embeddings": 131072, "rope_scaling": {"factor": 8.0, "rope_type": "llama3"}},
     (131072, "max_position_embeddings")),
    ({}, None),  # transformers fills the config class's default: only SGLang itself knows it
])
def test_derived_context_length_follows_sglang(extra, expected):
    assert derived_context_length({**DENSE, **extra}) == expected


def _folder(tmp_path, content, raw: str | None = None):
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(raw if raw is not None else json.dumps(content))
    (d / "model.safetensors").write_bytes(b"\0" * 1000)
    return d


@pytest.mark.parametrize("content", [[1, 2], "qwen", 3.5, {**DENSE, "num_hidden_layers": "64"}, {"text_config": 1}])
@pytest.mark.parametrize("verb", [("plan",), ("serve", "--print"), ("up", "--dry-run")])
def test_every_verb_refuses_a_bad_config_json_in_one_line(cli, tmp_path, monkeypatch, content, verb):
    """A config.json that is a list, a string or a number ended plan, serve --print and
    up --dry-run in a traceback (exit 1); a string count was accepted."""
    d = _folder(tmp_path, content)
    monkeypatch.setenv("ESCHA_SERVE_MODE", "native")
    r = cli(*verb, "-p", "rtx5060ti-tp2-fp8", "--set", f"model.host_dir={d}",
            *(["--host-ram", "24GiB"] if verb == ("plan",) else []))
    errors = [ln for ln in r.err.splitlines() if f"{d / 'config.json'}: " in ln]
    assert len(errors) == 1 and errors[0].startswith("error: "), r.err
    # up --dry-run runs up's preflight too: on a daemon without an NVIDIA runtime that refusal
    # (exit 3) is reported beside the bad file
    assert r.code == 2 or (verb[0] == "up" and r.code == 3), (r.code, r.out, r.err)
    assert "Traceback" not in r.err + r.out


def test_plan_refuses_a_context_length_past_the_models(cli, tmp_path):
    d = _folder(tmp_path, {**DENSE, "max_position_embeddings": 4096})
    r = cli("plan", "-p", "rtx5060ti-tp2-fp8", "--set", f"model.host_dir={d}", "--set", "runtime.context_length=8192",
            "--host-ram", "24GiB", "-f", "json")
    assert r.code == 3, r.err
    reasons = json.loads(r.out)["reasons"]
    assert any("runtime.context_length: 8192 tokens is more than the 4096" in x and "max_position_embeddings" in x
               for x in reasons), reasons


def test_the_profile_can_pass_sglangs_override(cli, tmp_path):
    d = _folder(tmp_path, {**DENSE, "max_position_embeddings": 4096})
    args = ("-p", "rtx5060ti-tp2-fp8", "--set", f"model.host_dir={d}", "--set", "runtime.context_length=8192",
            "--set", "runtime.allow_longer_context_length=true")
    r = cli("plan", *args, "--host-ram", "24GiB", "-f", "json")
    assert r.code == 0, r.err
    assert any("allowed by runtime.allow_longer_context_length" in w for w in json.loads(r.out)["warnings"])
    r = cli("serve", "--print", *args)
    assert json.loads(r.out)["env"]["SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"] == "1", r.out


def test_within_the_models_length_plans_ok(cli, tmp_path):
    d = _folder(tmp_path, {**DENSE, "max_position_embeddings": 8192})
    r = cli("plan", "-p", "rtx5060ti-tp2-fp8", "--set", f"model.host_dir={d}", "--set", "runtime.context_length=8192",
            "--host-ram", "24GiB")
    assert r.code == 0, r.err


def test_a_hybrid_model_without_a_full_attention_layer_is_refused(cli, tmp_path):
    """Fewer layers than full_attention_interval left no KV layer: plan ended in ZeroDivisionError."""
    r = cli("plan", "-p", "rtx5060ti-tp2-fp8", "--set", "model.architecture.num_hidden_layers=1", "--host-ram", "64GiB")
    assert r.code == 2 and "num_hidden_layers 1 is below full_attention_interval 4" in r.err, r.err
    assert "Traceback" not in r.err
    d = _folder(tmp_path, {"model_type": "qwen3_5_text", "num_hidden_layers": 2, "num_key_value_heads": 4, "head_dim": 256,
                           "full_attention_interval": 4, "linear_num_key_heads": 16, "linear_num_value_heads": 48,
                           "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4})
    r = cli("plan", "-p", "rtx5060ti-tp2-fp8", "--set", f"model.host_dir={d}", "--host-ram", "64GiB")
    assert r.code == 2 and "config.json: num_hidden_layers 2 is below full_attention_interval 4" in r.err, r.err


@pytest.mark.parametrize("field", ["linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                                   "linear_value_head_dim", "linear_conv_kernel_dim"])
def test_a_hybrid_architecture_with_a_gdn_field_null_is_refused(cli, field):
    """A hybrid GDN architecture (full_attention_interval set) with one linear_* field set to null,
    planned without a model folder: rank_shapes multiplied None (TypeError traceback, exit 1)."""
    r = cli("plan", "-p", "rtx5060ti-tp2-fp8", "--set", f"model.architecture.{field}=null", "--host-ram", "64GiB",
            "--linux")
    assert r.code == 2 and "Traceback" not in r.err, r.err
    assert f"model.architecture: a hybrid GDN model (full_attention_interval 4) needs {field}" in r.err, r.err
    # a plain transformer (no full_attention_interval) needs none of them
    r = cli("plan", "-p", "linux-tp2-l3", "--set", "runtime.needs=[]", "--set", "model.architecture.full_attention_interval=null",
            "--set", f"model.architecture.{field}=null", "--set", "runtime.max_mamba_cache_size=null",
            "--host-ram", "256GiB", "--linux")
    assert r.code in (0, 3) and "Traceback" not in r.err and "a hybrid GDN model" not in r.err, r.err


@pytest.mark.parametrize("factor, message", [
    (0, "rope_scaling.factor: input should be greater than 0 (got 0)"),
    (-2.0, "rope_scaling.factor: input should be greater than 0 (got -2.0)"),
])
def test_a_rope_factor_that_leaves_no_context_is_refused(factor, message):
    with pytest.raises(ValueError) as exc:
        derived_context_length({**DENSE, "max_position_embeddings": 32768, "rope_scaling": {"factor": factor}})
    assert str(exc.value) == message


def test_a_rope_factor_of_1e308_is_one_line_not_an_overflow():
    """1e308 x 32768 is inf; ``int(inf)`` was an OverflowError traceback."""
    with pytest.raises(ValueError) as exc:
        derived_context_length({**DENSE, "max_position_embeddings": 32768, "rope_scaling": {"factor": 1e308}})
    assert str(exc.value) == ("rope_scaling.factor 1e+308 x max_position_embeddings 32768 is inf tokens of "
                              "context, past 9.01e+15 (2**53, the largest count a float holds exactly)")


@pytest.mark.parametrize("raw, words", [
    (json.dumps({**DENSE, "max_position_embeddings": 32768, "rope_scaling": {"factor": 1e308}}),
     "is inf tokens of context"),
    (json.dumps({**DENSE, "max_position_embeddings": 32768, "rope_scaling": {"factor": 0}}),
     "rope_scaling.factor: input should be greater than 0 (got 0)"),
    ("\ufeff" + json.dumps({**DENSE, "max_position_embeddings": 32768}),
     "config.json:1: the model's config.json starts with a UTF-8 byte order mark"),
])
def test_plan_refuses_a_config_json_sglang_cannot_start_with(cli, tmp_path, raw, words):
    d = _folder(tmp_path, None, raw=raw)
    r = cli("plan", "-p", "rtx5060ti-tp2-fp8", "--set", f"model.host_dir={d}", "--host-ram", "24GiB")
    errors = [ln for ln in r.err.splitlines() if ln.startswith("error: ")]
    assert r.code == 2 and len(errors) == 1 and words in errors[0], (r.code, r.err)
    assert "Traceback" not in r.err + r.out
