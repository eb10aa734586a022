"""Random-weight ``Qwen3_5ForCausalLM`` test models, made where they run (no download).

    python3 tests/gpu_rig/make_model.py CONFIG OUT      CONFIG: tiny | shape-true | a JSON file

``CONFIGS`` holds the two the GPU rig profiles (tests/gpu_rig/*.yaml) serve:

- ``tiny``: 4 layers (3 linear-attention + 1 full), 4 q / 2 KV heads of 128, GDN 2 key / 4 value
  heads of 128, conv 4, hidden 512, vocab 2048: 12.6 M parameters, made in seconds.
- ``tiny-mtp``: ``tiny`` with one MTP layer (``mtp_num_hidden_layers: 1`` and the ``mtp.*``
  tensors of a Qwen3.5 checkpoint, in ``model-mtp.safetensors``: ``_mtp_tensors``), the draft a
  NEXTN server loads from the model's own folder.
- ``shape-true``: one TP-2 rank of ``rtx5060ti-tp2-fp8``'s model at TP 1: 64 layers, every 4th
  full attention, 2 KV heads of 256 and GDN 8 key / 24 value heads of 128 (the profile's 4 KV
  and 16 / 48 GDN heads halved), conv 4; hidden 512 and vocab 2048 keep the weights small
  (440.6 M parameters, 881 MB): the KV bytes per token and the mamba state per slot depend only
  on the head shapes and layer counts (SGLang ``srt/configs/mamba_utils.py: Mamba2StateShape``,
  ``srt/mem_cache/memory_pool.py: MHATokenToKVPool``), not on the hidden size.

The model is ``transformers``' own (``Qwen3_5TextConfig``/``Qwen3_5ForCausalLM``, transformers
5.12.1, SGLang 0.5.19's pin), bf16 safetensors; ``full_attention_interval``, ``rope_theta`` and
``partial_rotary_factor`` are also written at the top of config.json, where SGLang's
``srt/configs/qwen3_next.py``-style config reads them. The tokenizer is a byte-level BPE of
``TOKENIZER_VOCAB`` tokens trained with ``tokenizers`` on this checkout's own docs
(deterministic for one checkout), saved by ``PreTrainedTokenizerFast``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VOCAB = 2048
#: Below VOCAB: token ids past the tokenizer's are valid embeddings the tests may send as ids.
TOKENIZER_VOCAB = 2000
EOS = "<|endoftext|>"

_COMMON = dict(vocab_size=VOCAB, hidden_size=512, intermediate_size=1024, linear_conv_kernel_dim=4,
               linear_key_head_dim=128, linear_value_head_dim=128,
               rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
               eos_token_id=0, pad_token_id=0, bos_token_id=None, tie_word_embeddings=False)
CONFIGS: dict[str, dict] = {
    "tiny": dict(_COMMON, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=128,
                 linear_num_key_heads=2, linear_num_value_heads=4, max_position_embeddings=8192),
    # tiny with one MTP layer (the NEXTN draft SGLang loads from the model's own folder)
    "tiny-mtp": dict(_COMMON, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=128,
                     linear_num_key_heads=2, linear_num_value_heads=4, max_position_embeddings=8192,
                     mtp_num_hidden_layers=1),
    "shape-true": dict(_COMMON, num_hidden_layers=64, num_attention_heads=8, num_key_value_heads=2, head_dim=256,
                       linear_num_key_heads=8, linear_num_value_heads=24, max_position_embeddings=32768),
}
FULL_ATTENTION_INTERVAL = 4


def architecture(config: dict) -> dict:
    """The profile's ``model.architecture`` keys this config gives (the rig profiles carry them)."""
    keys = ("num_hidden_layers", "num_key_value_heads", "head_dim", "hidden_size", "linear_num_key_heads",
            "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim")
    return {"model_type": "qwen3_5_text", "full_attention_interval": FULL_ATTENTION_INTERVAL,
            **{k: config[k] for k in keys}}


def _corpus() -> list[str]:
    files = sorted(REPO.glob("docs/*.md"))
    return [f.read_text(errors="replace") for f in files]


def make_tokenizer(out: Path) -> None:
    """A byte-level BPE (``TOKENIZER_VOCAB`` tokens, ``EOS`` id 0) into ``out``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TOKENIZER_VOCAB, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS, model_max_length=32768)
    fast.save_pretrained(str(out))


def make_model(config: dict, out: Path, seed: int = 0) -> dict:
    """Write the model of ``config`` (``CONFIGS`` entry or the same keys) and a tokenizer into
    ``out``; returns ``{parameters, bytes, seconds}``."""
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    t0 = time.monotonic()
    torch.manual_seed(seed)
    config = dict(config)
    mtp_layers = config.pop("mtp_num_hidden_layers", 0)
    layers = config["num_hidden_layers"]
    types = (["linear_attention"] * (FULL_ATTENTION_INTERVAL - 1) + ["full_attention"]) * (
        layers // FULL_ATTENTION_INTERVAL)
    cfg = Qwen3_5TextConfig(**config, layer_types=types)
    with torch.device("cpu"):
        model = Qwen3_5ForCausalLM(cfg).to(torch.bfloat16)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    make_tokenizer(out)
    p = out / "config.json"
    c = json.loads(p.read_text())
    rope = config["rope_parameters"]
    c.update(full_attention_interval=FULL_ATTENTION_INTERVAL, rope_theta=rope["rope_theta"],
             partial_rotary_factor=rope["partial_rotary_factor"], torch_dtype="bfloat16", dtype="bfloat16")
    mtp_parameters = 0
    if mtp_layers:
        from safetensors.torch import save_file

        tensors = _mtp_tensors(config, mtp_layers)
        save_file(tensors, str(out / "model-mtp.safetensors"), metadata={"format": "pt"})
        mtp_parameters = sum(t.numel() for t in tensors.values())
        c["mtp_num_hidden_layers"] = mtp_layers
    p.write_text(json.dumps(c, indent=1))
    return {"parameters": sum(x.numel() for x in model.parameters()) + mtp_parameters,
            "bytes": sum(f.stat().st_size for f in out.iterdir() if f.is_file()),
            "seconds": round(time.monotonic() - t0, 1)}


def _mtp_tensors(config: dict, layers: int) -> dict:
    """The ``mtp.*`` tensors of a Qwen3.5 checkpoint with ``layers`` MTP layers, bf16, random:
    ``mtp.fc.weight`` (hidden x 2 hidden), ``mtp.pre_fc_norm_embedding.weight`` and
    ``mtp.pre_fc_norm_hidden.weight``, ``mtp.norm.weight``, and per layer a full-attention decoder
    layer's tensors as ``transformers``' ``Qwen3_5ForCausalLM`` names them (``mtp.layers.N.self_attn.
    q_proj.weight``, ...), the names SGLang's ``srt/models/qwen3_5_mtp.py:
    Qwen3_5ForCausalLMMTP.load_weights`` maps onto its draft (``mtp.`` to ``model.``, its MTP
    model's layers all full attention: ``full_attention_interval = 1``)."""
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    one = dict(config, num_hidden_layers=layers)
    with torch.device("cpu"):
        block = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**one, layer_types=["full_attention"] * layers)).to(torch.bfloat16)
    out = {f"mtp.{k[len('model.'):]}": v.contiguous() for k, v in block.state_dict().items()
           if k.startswith(("model.layers.", "model.norm."))}
    hidden = config["hidden_size"]
    out["mtp.fc.weight"] = (torch.randn(hidden, 2 * hidden) * 0.02).to(torch.bfloat16)
    for name in ("pre_fc_norm_embedding", "pre_fc_norm_hidden"):
        out[f"mtp.{name}.weight"] = torch.zeros(hidden, dtype=torch.bfloat16)  # GemmaRMSNorm: 1 + weight
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: make_model.py tiny|shape-true|CONFIG.json OUT", file=sys.stderr)
        return 2
    name, out = argv
    if name in CONFIGS:
        config = CONFIGS[name]
    else:
        try:
            config = json.loads(Path(name).read_text())
        except (OSError, ValueError) as exc:
            print(f"make_model: {name}: not a config name ({', '.join(CONFIGS)}) or JSON file ({exc})", file=sys.stderr)
            return 2
    print(json.dumps({"model": name, "out": out, **make_model(config, Path(out))}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
