"""Model architecture: which layers hold a KV cache, and how many bytes one token or one
mamba state slot costs per TP rank, the way SGLang 0.5.19 decides it.

Pure functions over ``ModelArch``; ``read_model_dir()`` is the one edge that reads a model
directory (config.json, safetensors sizes). Sources, all in the 0.5.19 wheel under ``sglang/``:

- layer typing: ``srt/configs/qwen3_next.py: Qwen3NextConfig.layers_block_type``: layer ``l``
  is full attention iff ``(l + 1) % full_attention_interval == 0``; ``layer_types`` is ignored.
- KV heads per rank: ``srt/configs/model_config.py: ModelConfig.get_num_kv_heads``:
  ``max(1, total_kv_heads // tp)`` (replicated when fewer heads than ranks).
- mamba state shapes: ``srt/configs/mamba_utils.py: Mamba2StateShape.create`` (conv state
  ``(conv_dim / tp, conv_kernel - 1)`` in bf16 by default, temporal state
  ``(HV / tp, V, K)`` in the SSM dtype, fp32 by default).
"""

# No `from __future__ import annotations` here: pydantic would evaluate every string annotation
# of these models at class creation (typing._eval_type), about half of this module's import
# time, on every command that plans (docs/performance.md).

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

DTYPE_BYTES: dict[str, int] = {
    "float32": 4, "fp32": 4, "float16": 2, "fp16": 2, "bfloat16": 2, "bf16": 2,
    "float8": 1, "fp8": 1, "uint8": 1,
}

#: ``model_type`` values SGLang 0.5.19 treats as hybrid GDN (``srt/configs/hybrid_arch.py:
#: hybrid_gdn_config`` via ``_CONFIG_REGISTRY``).
HYBRID_GDN_MODEL_TYPES = frozenset(
    {"qwen3_next", "qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text"}
)


#: Largest layer count, head count or head dim accepted.
MAX_DIM = 16384

#: The GDN fields a hybrid model needs besides ``full_attention_interval`` (``ModelArch``).
HYBRID_FIELDS = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
                 "linear_conv_kernel_dim")


class ModelArch(BaseModel):
    """The architecture fields the planner needs, named as in the HF config.json.

    A hybrid GDN model has ``full_attention_interval`` and the ``linear_*`` fields; a plain
    transformer leaves them unset. ``mamba_ssm_dtype`` is the SSM (temporal) state dtype
    (config ``mamba_ssm_dtype``; SGLang's default float32).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    model_type: str = Field(description="config.json model_type, e.g. qwen3_5_text")
    # Upper bounds (MAX_DIM) keep a typo from building a per-layer list of billions of entries;
    # the largest public configs have a few hundred layers and heads and dims of a few thousand.
    num_hidden_layers: int = Field(gt=0, le=MAX_DIM, description="all decoder layers (full attention + linear)")
    num_key_value_heads: int = Field(gt=0, le=MAX_DIM, description="total KV heads (all ranks)")
    head_dim: int = Field(gt=0, le=MAX_DIM, description="elements per KV head")
    hidden_size: int | None = Field(default=None, gt=0, le=2**20, description="model width (informational)")
    full_attention_interval: int | None = Field(
        default=None, gt=0, le=MAX_DIM, description="hybrid models: every Nth layer is full attention"
    )
    linear_num_key_heads: int | None = Field(default=None, gt=0, le=MAX_DIM, description="GDN key heads (n_groups), all ranks")
    linear_num_value_heads: int | None = Field(default=None, gt=0, le=MAX_DIM, description="GDN value heads (HV), all ranks")
    linear_key_head_dim: int | None = Field(default=None, gt=0, le=MAX_DIM, description="GDN key head dim (K)")
    linear_value_head_dim: int | None = Field(default=None, gt=0, le=MAX_DIM, description="GDN value head dim (V)")
    linear_conv_kernel_dim: int | None = Field(default=None, gt=1, le=1024, description="GDN conv kernel; the state keeps kernel-1 columns")
    mamba_ssm_dtype: Literal["float32", "bfloat16", "float16"] = Field(default="float32", description="SSM (temporal) state dtype; SGLang's default float32")
    mamba_conv_dtype: Literal["bfloat16", "float16", "float32"] = Field(
        default="bfloat16", description="SGLANG_MAMBA_CONV_DTYPE default"
    )

    @model_validator(mode="after")
    def _has_a_kv_layer(self) -> "ModelArch":
        # layer l is full attention iff (l + 1) % full_attention_interval == 0: fewer layers than
        # the interval leaves no KV layer, and every per-token KV figure is 0 (a division by it failed)
        if self.full_attention_interval is not None and self.num_hidden_layers < self.full_attention_interval:
            raise ValueError(f"num_hidden_layers {self.num_hidden_layers} is below full_attention_interval "
                             f"{self.full_attention_interval}: no layer would be full attention")
        # a hybrid model's GDN state is sized from every linear_* field (SGLang's
        # srt/configs/mamba_utils.py: Mamba2StateShape.create, as rank_shapes mirrors it); one set
        # to null (a profile's --set, where config.json is not read) left rank_shapes multiplying None
        missing = [k for k in HYBRID_FIELDS if getattr(self, k) is None]
        if self.full_attention_interval is not None and missing:
            raise ValueError(f"a hybrid GDN model (full_attention_interval {self.full_attention_interval}) needs "
                             f"{', '.join(missing)}: its mamba state is sized from them")
        return self

    @property
    def is_hybrid(self) -> bool:
        return self.full_attention_interval is not None

    def full_attention_layer_ids(self) -> list[int]:
        """Layers with a KV cache (all of them for a plain transformer)."""
        if not self.is_hybrid:
            return list(range(self.num_hidden_layers))
        k = self.full_attention_interval
        return [i for i in range(self.num_hidden_layers) if (i + 1) % k == 0]

    def linear_layer_ids(self) -> list[int]:
        full = set(self.full_attention_layer_ids())
        return [i for i in range(self.num_hidden_layers) if i not in full]


class RankShapes(BaseModel):
    """Per-TP-rank shapes of one model at one TP size (bytes are per rank)."""

    model_config = ConfigDict(frozen=True)
    tp_size: int
    full_layers: int
    linear_layers: int
    kv_heads_per_rank: int
    head_dim: int
    mamba_conv_bytes_per_layer: int = 0
    mamba_temporal_bytes_per_layer: int = 0

    @property
    def mamba_bytes_per_slot(self) -> int:
        """One mamba state slot, all linear layers of this rank (``mamba_cache_per_req``)."""
        return self.linear_layers * (self.mamba_conv_bytes_per_layer + self.mamba_temporal_bytes_per_layer)


def kv_heads_per_rank(total_kv_heads: int, tp: int) -> int:
    """``ModelConfig.get_num_kv_heads``: ``max(1, total // tp)``."""
    return max(1, total_kv_heads // tp)


def rank_shapes(arch: ModelArch, tp: int) -> RankShapes:
    """Per-rank layer counts, KV heads and mamba state bytes at TP size ``tp``.

    Mamba (``Mamba2StateShape.create``): ``n_groups = linear_num_key_heads`` extended by
    ``tp - n_groups`` when not divisible by tp; ``conv_dim = V*HV + 2*n_groups*K``; conv state
    per rank ``conv_dim/tp * (kernel-1)`` elements; temporal ``HV/tp * V * K`` elements.
    Check against the reference box (2 x RTX 5060 Ti, Qwen3.x-27B hybrid GDN, TP 2): 48 GDN layers x (5120*3*2 + 24*128*128*4) =
    76,972,032 B per slot per rank.
    """
    full = len(arch.full_attention_layer_ids())
    linear = arch.num_hidden_layers - full
    conv = temporal = 0
    if arch.is_hybrid and linear:
        n_groups = arch.linear_num_key_heads
        if n_groups % tp != 0:
            n_groups += tp - n_groups
        conv_dim = arch.linear_value_head_dim * arch.linear_num_value_heads + 2 * n_groups * arch.linear_key_head_dim
        conv = (conv_dim // tp) * (arch.linear_conv_kernel_dim - 1) * DTYPE_BYTES[arch.mamba_conv_dtype]
        temporal = (
            (arch.linear_num_value_heads // tp) * arch.linear_value_head_dim * arch.linear_key_head_dim
            * DTYPE_BYTES[arch.mamba_ssm_dtype]
        )
    return RankShapes(
        tp_size=tp, full_layers=full, linear_layers=linear,
        kv_heads_per_rank=kv_heads_per_rank(arch.num_key_value_heads, tp), head_dim=arch.head_dim,
        mamba_conv_bytes_per_layer=conv, mamba_temporal_bytes_per_layer=temporal,
    )


#: config.json fields read as integers (counts and dims): a JSON integer, never a string,
#: a float or a boolean (SGLang does arithmetic and ``range()`` over them:
#: ``srt/configs/model_config.py: ModelConfig._derive_model_shapes``).
#: The config.json counts and dimensions the planner reads, each with the least value it may
#: hold (when present: absence has its own rules): a layer, head or dimension count of 0 sizes
#: nothing (``head_dim: 0`` would plan a KV cell of 0 bytes); the conv kernel keeps ``kernel - 1``
#: columns of state, so 1 keeps none (``mamba_utils.py: Mamba2StateShape.create``). One table,
#: checked in one place (``_check_types``) for the model's and the draft's config.json.
CONFIG_MINIMUMS: dict[str, int] = {
    "num_hidden_layers": 1, "num_attention_heads": 1, "num_key_value_heads": 1, "num_kv_heads": 1,
    "n_head_kv": 1, "head_dim": 1, "hidden_size": 1, "full_attention_interval": 1,
    "linear_num_key_heads": 1, "linear_num_value_heads": 1, "linear_key_head_dim": 1,
    "linear_value_head_dim": 1, "linear_conv_kernel_dim": 2,
}
_INT_KEYS = tuple(CONFIG_MINIMUMS)

#: The keys SGLang 0.5.19 reads the model's context length from, first present wins
#: (``srt/utils/hf_transformers/common.py: CONTEXT_LENGTH_KEYS``).
CONTEXT_LENGTH_KEYS = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length",
                       "max_position_embeddings")


def _json_kind(value: object) -> str:
    """How a JSON value reads in a message: ``the string '64'``, ``a list``, ``true``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"the string {shown!r}"
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    return {dict: "an object", list: "a list"}.get(type(value), type(value).__name__)


def _text_config(config: object) -> dict:
    """The mapping SGLang reads the text model from (``hf_config.get_text_config()``): the
    nested ``text_config`` object when present, else the top level. Raises ``ValueError``
    naming the key for a top level or ``text_config`` that is not a JSON object."""
    if not isinstance(config, dict):
        raise ValueError(f"expected a JSON object at the top level (got {_json_kind(config)})")
    text = config.get("text_config")
    if text is None:
        return config
    if not isinstance(text, dict):
        raise ValueError(f"text_config: expected an object (got {_json_kind(text)})")
    return text or config


def _check_types(text: dict, config: dict) -> None:
    """Shape and type rules for the fields the planner reads; raises ``ValueError`` naming the
    first wrong field (``text_config.`` prefixed when nested)."""
    where = "text_config." if text is not config else ""
    for key in (*_INT_KEYS, *CONTEXT_LENGTH_KEYS):
        value = text.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f"{where}{key}: expected an integer (got {_json_kind(value)})")
        least = CONFIG_MINIMUMS.get(key, 1)  # a context length of 0 tokens holds no request
        if value is not None and value < least:
            raise ValueError(f"{where}{key}: input should be greater than {least - 1} "
                             f"(got {_json_kind(value)})")
    for key in ("model_type", "mamba_ssm_dtype"):
        for scope, mapping in ((where, text), ("", config)):
            value = mapping.get(key)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"{scope}{key}: expected a string (got {_json_kind(value)})")
    rope = text.get("rope_scaling")
    if rope is not None:
        if not isinstance(rope, dict):
            raise ValueError(f"{where}rope_scaling: expected an object or null (got {_json_kind(rope)})")
        factor = rope.get("factor")
        if factor is not None and (isinstance(factor, bool) or not isinstance(factor, (int, float))):
            raise ValueError(f"{where}rope_scaling.factor: expected a number (got {_json_kind(factor)})")
        # SGLang multiplies the context length by it (get_context_length): 0 or less leaves no
        # context (transformers 5.12 modeling_rope_utils.py warns below 1: "factor field must be
        # a float or int >= 1"; a factor in (0, 1) is a warning there, and plans here)
        if factor is not None and not factor > 0:
            raise ValueError(f"{where}rope_scaling.factor: input should be greater than 0 (got {factor!r})")


#: The largest context length read from a config.json (tokens): 2**53, past which a float
#: (SGLang computes ``rope_scaling.factor`` times the length in floats) no longer counts exactly.
MAX_CONTEXT_TOKENS = float(2**53)


def derived_context_length(config: object) -> tuple[int, str] | None:
    """The context length SGLang 0.5.19 derives from a model's config.json, and the key it came
    from: the first of ``CONTEXT_LENGTH_KEYS`` present in the text config, times the
    ``rope_scaling`` factor unless the scaling names ``original_max_position_embeddings`` or is
    ``llama3`` (``srt/utils/hf_transformers/common.py: get_context_length``). ``None`` when no
    key is in the file: transformers then fills the config class's own default, which only
    SGLang's pre-flight sees. Raises ``ValueError`` as ``arch_from_config``."""
    text = _text_config(config)
    _check_types(text, config)  # type: ignore[arg-type]
    rope = text.get("rope_scaling") or {}
    factor = rope.get("factor", 1)
    if "original_max_position_embeddings" in rope or rope.get("rope_type") == "llama3":
        factor = 1
    for key in CONTEXT_LENGTH_KEYS:
        value = text.get(key)
        if value is not None:
            tokens = factor * value
            if not tokens <= MAX_CONTEXT_TOKENS:  # inf too: int() of it is an OverflowError
                raise ValueError(f"rope_scaling.factor {factor:g} x {key} {value} is {tokens:.3g} tokens of "
                                 f"context, past {MAX_CONTEXT_TOKENS:.3g} (2**53, the largest count a "
                                 "float holds exactly)")
            return int(tokens), key if factor == 1 else f"{key} x rope_scaling.factor {factor:g}"
    return None


def arch_from_config(config: object) -> ModelArch:
    """Build a ``ModelArch`` from an HF config.json value (Qwen3.5-style nested
    ``text_config`` included: SGLang reads ``hf_config.get_text_config()``).

    Raises ``ValueError`` with one line naming the key: a top level or ``text_config`` that is
    not an object, a count that is not a JSON integer (``"64"``, ``64.0`` and ``true`` are
    refused), a missing key, or a value out of range.
    """
    text = _text_config(config)
    assert isinstance(config, dict)
    _check_types(text, config)
    model_type = text.get("model_type") or config.get("model_type") or "unknown"
    heads = text.get("num_attention_heads")
    kv = next((text[k] for k in ("num_key_value_heads", "num_kv_heads", "n_head_kv") if text.get(k) is not None), heads)
    head_dim = text.get("head_dim") or (text["hidden_size"] // heads if heads and text.get("hidden_size") else None)
    missing = [k for k, v in (("num_hidden_layers", text.get("num_hidden_layers")),
                              ("num_key_value_heads", kv), ("head_dim", head_dim)) if v is None]
    if missing:
        raise ValueError(f"config.json lacks {', '.join(missing)}")
    fields = dict(
        model_type=model_type, num_hidden_layers=text["num_hidden_layers"], num_key_value_heads=kv,
        head_dim=head_dim, hidden_size=text.get("hidden_size"),
    )
    if model_type in HYBRID_GDN_MODEL_TYPES or "full_attention_interval" in text:
        if "full_attention_interval" not in text:
            # 0.5.19 reads it through **kwargs; without it attribute access fails at load.
            raise ValueError("config.json of a hybrid GDN model lacks full_attention_interval")
        for k in ("full_attention_interval", *HYBRID_FIELDS):
            if text.get(k) is None:
                raise ValueError(f"config.json of a hybrid GDN model lacks {k}")
            fields[k] = text[k]
        if text.get("mamba_ssm_dtype"):
            fields["mamba_ssm_dtype"] = text["mamba_ssm_dtype"]
    try:
        return ModelArch(**fields)
    except ValidationError as exc:
        err = exc.errors()[0]
        if not err["loc"]:  # a rule over several fields (_has_a_kv_layer): its own words
            raise ValueError(str(err["msg"]).removeprefix("Value error, ")) from None
        key = ".".join(str(p) for p in err["loc"])
        raise ValueError(f"{key}: {err['msg'].lower()} (got {_json_kind(err.get('input'))})") from None


def describe_arch(arch: ModelArch) -> str:
    """One phrase naming a model's kind and shape, for messages:
    ``"qwen3_5_text (hybrid GDN: 64 layers, full attention every 4, 4 KV heads of 256)"`` or
    ``"llama (dense: 32 layers, 8 KV heads of 128)"``."""
    kv = f"{arch.num_key_value_heads} KV heads of {arch.head_dim}"
    if arch.is_hybrid:
        return (f"{arch.model_type} (hybrid GDN: {arch.num_hidden_layers} layers, full attention every "
                f"{arch.full_attention_interval}, {kv})")
    return f"{arch.model_type} (dense: {arch.num_hidden_layers} layers, {kv})"


def arch_mismatch(folder: ModelArch, declared: ModelArch) -> str | None:
    """How a model folder's architecture (config.json) differs from a profile's declared
    ``model.architecture``; ``None`` when they agree on every field the planner sizes with
    (``hidden_size`` is informational and not compared). A different ``model_type`` or kind
    (hybrid vs dense) names both models; otherwise the differing fields, folder value first."""
    if folder.model_type != declared.model_type or folder.is_hybrid != declared.is_hybrid:
        return f"{describe_arch(folder)}, not the profile's model.architecture {describe_arch(declared)}"
    ours, theirs = folder.model_dump(exclude={"hidden_size"}), declared.model_dump(exclude={"hidden_size"})
    diff = [f"{k} {ours[k]} (model.architecture: {theirs[k]})" for k in ours if ours[k] != theirs[k]]
    return f"{folder.model_type} with {', '.join(diff)}" if diff else None


class ModelDirFacts(BaseModel):
    """What a model directory says: its architecture and its weight bytes on disk."""

    model_config = ConfigDict(frozen=True)
    path: str
    arch: ModelArch | None = None
    safetensors_bytes: int | None = Field(default=None, description="sum of *.safetensors sizes")
    context_length: int | None = Field(
        default=None, description="tokens: the context length SGLang derives from config.json "
        "(derived_context_length); None when config.json names none")
    context_length_key: str | None = Field(default=None, description="the config.json key it came from")
    tensor_bytes: int | None = Field(
        default=None, description="bytes of the tensors the model loads, from the safetensors headers: "
        "dtype size x shape, the MTP tensors apart (safetensors_header_weights); None when a header could not "
        "be read that way (then safetensors_bytes, the file sizes, stand in)")
    mtp_tensor_bytes: int | None = Field(default=None, description="bytes of the MTP tensors (names with 'mtp')")
    header_note: str = Field(default="", description="why the headers were not used, when they were not")
    quant_method: str | None = Field(default=None, description="config.json's quantization_config.quant_method "
                                     "(or compression_config's), as SGLang's model config reads it; None: none")
    num_attention_heads: int | None = Field(default=None, description="config.json's query heads (all ranks; "
                                            "the text config's num_attention_heads); None when it names none")
    v_head_dim: int | None = Field(default=None, description="config.json's v_head_dim; None when absent or 0, "
                                   "where SGLang's model config takes head_dim (srt/configs/model_config.py)")
    architectures: tuple[str, ...] = Field(default=(), description="config.json's architectures")
    kv_rank_replicated: bool = Field(default=False, description="SGLang keeps the KV rank-replicated (MLA): the "
                                     "file L3 store's files are TP rank 0's (sglang.filestore.rank_replicated)")
    text_subconfig: bool = Field(default=False, description="config.json nests its text model (thinker_config, "
                                 "llm_config, language_config or text_config: SGLang's hf_text_config is not the "
                                 "top config)")
    media_configs: tuple[str, ...] = Field(default=(), description="config.json's vision_config and audio_config, "
                                           "those present")
    language_model_only: bool = Field(default=False, description="config.json's language_model_only")


def quant_method_of(config: dict) -> tuple[str, str] | None:
    """``(field, value)``: the quantization method a config.json names, where SGLang 0.5.19 looks
    (``srt/configs/model_config.py: _parse_quant_hf_config``: ``quantization_config``, else
    ``compression_config``), as ``quantization_config.quant_method``; None when it names none
    (no such section, or a section without a string ``quant_method``: modelopt's, detected
    by SGLang from other keys)."""
    for section in ("quantization_config", "compression_config"):
        qc = config.get(section)
        if isinstance(qc, dict):
            m = qc.get("quant_method")
            return (f"{section}.quant_method", m) if isinstance(m, str) and m else None
    return None


def read_model_dir(path: str | Path) -> ModelDirFacts | None:
    """Read ``config.json`` and the safetensors sizes of a model directory; ``None`` when the
    directory does not exist here. The tensor bytes come from the checked headers
    (``safetensors_header_weights``); when a shard's header does not pass, ``tensor_bytes`` is
    None, the file sizes stand in, and ``header_note`` is the header's one-line error, naming
    the file. Raises ``BadInput`` naming the file for a config.json that cannot be read or is
    not JSON (``jsonio``), ``ValueError`` for one that lacks a field."""
    from escha_deploy.utils.jsonio import loads_json, read_regular

    p = Path(path)
    if not os.path.isdir(p):
        return None
    arch = None
    context: dict = {}
    cfg = p / "config.json"
    raw = read_regular(cfg, "the model's config.json", missing_ok=True)
    if raw is not None:
        config = loads_json(raw, cfg, "the model's config.json", bom=False)
        try:
            arch = arch_from_config(config)
            ctx = derived_context_length(config)
        except ValueError as exc:
            raise ValueError(f"{cfg}: {exc}") from None
        if ctx:
            context = {"context_length": ctx[0], "context_length_key": ctx[1]}
        qm = quant_method_of(config) if isinstance(config, dict) else None
        if qm is not None:
            context["quant_method"] = qm[1]
        text = _text_config(config)
        if isinstance(config, dict):
            from escha_deploy.sglang.filestore import rank_replicated

            archs = config.get("architectures")
            if isinstance(archs, list):
                context["architectures"] = tuple(a for a in archs if isinstance(a, str))
            context["kv_rank_replicated"] = rank_replicated(config)
            # get_hf_text_config's sub-configs (srt/utils/hf_transformers/common.py)
            context["text_subconfig"] = any(isinstance(config.get(k), dict) for k in
                                            ("thinker_config", "llm_config", "language_config", "text_config"))
            context["media_configs"] = tuple(k for k in ("vision_config", "audio_config")
                                             if isinstance(config.get(k), dict))
            context["language_model_only"] = config.get("language_model_only") is True
        for key in ("num_attention_heads", "v_head_dim"):
            value = text.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                context[key] = value
    from escha_deploy.utils.errors import BadInput
    from escha_deploy.utils.jsonio import is_regular_file

    shards = sorted(f for f in p.glob("*.safetensors") if is_regular_file(f))
    sizes = [f.stat().st_size for f in shards]
    measured: dict = {}
    if shards:
        try:
            model, mtp = safetensors_header_weights(shards)
            measured = {"tensor_bytes": model, "mtp_tensor_bytes": mtp}
        except BadInput as exc:  # a header that does not pass: its one line, and the file sizes stand in
            measured = {"header_note": exc.message}
        except OSError as exc:
            measured = {"header_note": f"{exc.filename or p}: cannot read: {exc.strerror or exc}"}
    return ModelDirFacts(path=str(p), arch=arch, safetensors_bytes=sum(sizes) if sizes else None, **context,
                         **measured)


#: Architectures whose draft SGLang 0.5.19 builds from the model's own MTP layers, with one
#: draft layer (``srt/configs/model_config.py: ModelConfig._config_draft_model`` sets
#: ``num_nextn_predict_layers = 1`` for them), and whose MTP tensors are those with ``mtp`` in
#: their name: the draft loads only those (``srt/models/qwen3_5_mtp.py:
#: Qwen3_5ForCausalLMMTP.load_weights``, ``srt/models/qwen3_next.py: load_weights(is_mtp=True)``)
#: and the target skips them.
MTP_ONE_LAYER_ARCHITECTURES = frozenset({
    "Qwen3NextForCausalLM", "Qwen3MoeForCausalLM", "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration", "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM",
})
#: Largest safetensors header read, in bytes: the format's own cap (safetensors' Rust crate
#: refuses a header above 100,000,000 bytes, ``MAX_HEADER_SIZE``).
MAX_SAFETENSORS_HEADER = 100_000_000


class DraftFacts(BaseModel):
    """What a speculative-decoding draft's folder says (``read_draft_dir``): the draft's weight
    bytes on disk (all ranks) and its layer count as SGLang 0.5.19 reads it for KV sizing.

    ``own_folder``: the draft folder is the model's own (NEXTN/MTP drafting with the model's MTP
    layers): ``weights_bytes`` is then the MTP tensors' bytes only (``mtp_bytes``), which the
    target does not load. ``num_layers``: ``spec_aux_hidden_state.py:
    _resolve_eagle_aux_hidden_state``'s ``eagle_draft_num_layers`` (the draft config's
    ``num_nextn_predict_layers``, else its ``num_hidden_layers``); ``None`` when config.json
    names neither. ``*_source``: where each came from, for the plan's lines."""

    model_config = ConfigDict(frozen=True)
    path: str
    own_folder: bool = False
    weights_bytes: int | None = Field(default=None, description="bytes, all ranks")
    weights_source: str = ""
    num_layers: int | None = None
    layers_source: str = ""
    #: ``ModelConfig.num_nextn_predict_layers`` of the draft as SGLang builds it
    #: (``model_config.py: _config_draft_model`` sets 1 for ``MTP_ONE_LAYER_ARCHITECTURES``;
    #: else the config's own, 0 when absent): HiCache packs the draft's KV into the target's host
    #: pool when it is set under EAGLE/NEXTN (``base_spec_worker.py: _can_pack_hicache_mtp``).
    nextn_layers: int = 0
    #: The draft's own KV geometry (its text config): total KV heads and elements per head, for a
    #: sidecar host pool (``hybrid_pool_assembler.py: build_full_draft_pools``); None: not named.
    kv_heads: int | None = None
    head_dim: int | None = None


def draft_kv_geometry(config: object) -> tuple[int | None, int | None, int]:
    """``(num_key_value_heads, head_dim, nextn_layers)`` of a draft's config.json as SGLang reads
    them (``head_dim`` else ``hidden_size // num_attention_heads``; ``nextn_layers`` as
    ``DraftFacts.nextn_layers``); None where the config names neither."""
    text = _text_config(config)
    assert isinstance(config, dict)
    archs = config.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None

    def whole(key: str) -> int | None:
        v = text.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None

    heads = whole("num_key_value_heads") or whole("num_attention_heads")
    head_dim = whole("head_dim")
    if head_dim is None and whole("hidden_size") and whole("num_attention_heads"):
        head_dim = text["hidden_size"] // text["num_attention_heads"]
    nextn = 1 if arch in MTP_ONE_LAYER_ARCHITECTURES else (whole("num_nextn_predict_layers") or 0)
    return heads, head_dim, nextn


def draft_folder_mismatch(draft_dir: str | Path, model_dir: str | Path, *, mtp: bool) -> str | None:
    """Why the draft folder cannot draft for the model folder, one line naming both, or None:
    an MTP draft (``mtp``: NEXTN, or a draft config with MTP layers) of another architecture than
    the model's (SGLang builds the MTP draft from the draft config's architecture,
    ``model_config.py: _config_draft_model``), a draft with more layers than the model, or a
    vocabulary of another size (the draft proposes token ids the target verifies:
    ``speculative/eagle_worker_v2.py`` shares the target's embedding and LM head). Reads both
    config.json files (text configs); a folder without one says nothing here."""
    from escha_deploy.utils.jsonio import loads_json, read_regular

    def text_of(folder: str | Path) -> tuple[str | None, dict] | None:
        cfg = Path(folder) / "config.json"
        raw = read_regular(cfg, "config.json", missing_ok=True)
        if raw is None:
            return None
        config = loads_json(raw, cfg, "config.json", bom=False)
        if not isinstance(config, dict):
            return None
        archs = config.get("architectures")
        arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
        return arch, _text_config(config)

    d, m = text_of(draft_dir), text_of(model_dir)
    if d is None or m is None:
        return None
    (d_arch, dt), (m_arch, mt) = d, m
    both = f"the draft folder {draft_dir} and the model folder {model_dir}"
    if mtp and d_arch and m_arch and d_arch != m_arch:
        return (f"{both} are of other architectures ({d_arch} and {m_arch}): an MTP draft is built from the "
                "model's own architecture (model_config.py: _config_draft_model); name the model's own folder")
    dl, ml = dt.get("num_hidden_layers"), mt.get("num_hidden_layers")
    if isinstance(dl, int) and isinstance(ml, int) and dl > ml:
        return (f"{both}: the draft has more layers ({dl}) than the model ({ml}); a draft is the smaller model "
                "(are the two folders swapped?)")
    dv, mv = dt.get("vocab_size"), mt.get("vocab_size")
    if isinstance(dv, int) and isinstance(mv, int) and dv != mv:
        return (f"{both} have vocabularies of {dv:,} and {mv:,} tokens: the target verifies the draft's token ids "
                "in its own vocabulary; use a draft trained for this model")
    return None


def draft_num_layers(config: object) -> tuple[int, str] | None:
    """The draft layer count SGLang 0.5.19 scales the target's KV cell by, read from the
    draft's config.json, and why: one for the architectures SGLang drafts with one MTP layer
    (``MTP_ONE_LAYER_ARCHITECTURES``), else ``num_nextn_predict_layers`` of the text config,
    else its ``num_hidden_layers`` (``spec_aux_hidden_state.py: _resolve_eagle_aux_hidden_state``:
    ``max(num_hidden_layers, num_attention_layers)``, equal for these models). ``None`` when it
    names neither. Raises ``ValueError`` as ``arch_from_config`` for a wrong shape or type."""
    text = _text_config(config)
    assert isinstance(config, dict)
    _check_types(text, config)
    archs = config.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    if arch in MTP_ONE_LAYER_ARCHITECTURES:
        return 1, f"{arch}: SGLang drafts with 1 MTP layer (model_config.py: ModelConfig._config_draft_model)"
    nextn = text.get("num_nextn_predict_layers")
    if nextn is not None:
        if isinstance(nextn, bool) or not isinstance(nextn, int) or nextn < 0:
            raise ValueError(f"num_nextn_predict_layers: expected a whole number (got {_json_kind(nextn)})")
        return nextn, "config.json num_nextn_predict_layers (spec_aux_hidden_state.py: _resolve_eagle_aux_hidden_state)"
    layers = text.get("num_hidden_layers")
    if layers is None:
        return None
    return layers, "config.json num_hidden_layers (spec_aux_hidden_state.py: _resolve_eagle_aux_hidden_state)"


#: Bits per element of each safetensors dtype (safetensors' Rust crate, ``src/tensor.rs``:
#: ``Dtype`` and ``Dtype::bitsize``; the sub-byte float formats since safetensors 0.6).
SAFETENSORS_DTYPE_BITS: dict[str, int] = {
    "BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8,
    "F8_E8M0": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32,
    "C64": 64, "F64": 64, "I64": 64, "U64": 64,
}


def _tensor_problem(info: object, data_len: int) -> str | None:
    """Why one safetensors header entry cannot describe a tensor in a data section of
    ``data_len`` bytes (``None``: it can): ``dtype`` one of ``SAFETENSORS_DTYPE_BITS``,
    ``shape`` a list of whole numbers >= 0, ``data_offsets`` ``[begin, end]`` whole numbers with
    ``0 <= begin <= end <= data_len``, and ``end - begin`` the bytes of ``shape`` elements of
    ``dtype`` (safetensors' ``Metadata::validate`` refuses the same: ``TensorInvalidInfo``,
    ``InvalidOffset``, ``MetadataIncompleteBuffer``)."""
    # exact type checks (``type(x) is int`` leaves bool out) and no generators: a header may hold
    # a million tensors, and this runs for each
    if type(info) is not dict:
        return "is not an object"
    offsets = info.get("data_offsets")
    if type(offsets) is not list or len(offsets) != 2:
        return "has no valid data_offsets"
    begin, end = offsets
    if type(begin) is not int or type(end) is not int or not 0 <= begin <= end:
        return "has no valid data_offsets"
    if end > data_len:
        return f"has data_offsets [{begin}, {end}] past the end of the file's data ({data_len:,} bytes)"
    dtype, shape = info.get("dtype"), info.get("shape")
    bits = SAFETENSORS_DTYPE_BITS.get(dtype) if type(dtype) is str else None
    if bits is None:
        return f"has dtype {dtype!r}, not a safetensors dtype ({', '.join(SAFETENSORS_DTYPE_BITS)})"
    if type(shape) is not list:
        return "has no valid shape (a list of whole numbers)"
    elements = 1
    for d in shape:
        if type(d) is not int or d < 0:
            return "has no valid shape (a list of whole numbers)"
        elements *= d
    if elements * bits != 8 * (end - begin):
        return f"holds {end - begin:,} bytes but {dtype} x {shape} is {elements * bits / 8:,.0f}"
    return None


def safetensors_header(path: str | Path) -> dict[str, dict]:
    """The tensors of one safetensors file, from its header alone: ``{name: {"dtype", "shape",
    "data_offsets": [begin, end]}}`` (``__metadata__`` left out), as the file's JSON has them.
    The format: an 8-byte little-endian header length ``n``, ``n`` bytes of a JSON object, then
    the data section, whose offsets count from its start. Every tensor is checked
    (``_tensor_problem``): its offsets inside the data section the file really holds, its byte
    count ``end - begin`` equal to dtype x shape, so a tensor's bytes are its offsets' span.
    The one reader of safetensors headers here. Raises ``BadInput`` naming the file (and the
    tensor) for a header length that is 0, above ``MAX_SAFETENSORS_HEADER`` or past the end of
    the file, a header that is not a JSON object, or a tensor entry that does not fit;
    ``OSError`` when the file cannot be read."""
    from escha_deploy.utils.errors import BadInput
    from escha_deploy.utils.jsonio import loads_json

    p = Path(path)
    with open(p, "rb") as fh:
        file_size = os.fstat(fh.fileno()).st_size
        head = fh.read(8)
        size = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 0 < size <= MAX_SAFETENSORS_HEADER:
            raise BadInput(f"{p}: not a safetensors file (header length {size})")
        if size > file_size - 8:
            raise BadInput(f"{p}: not a safetensors file (header length {size:,} runs past the end "
                           f"of the file, {file_size:,} bytes: truncated?)")
        raw = fh.read(size)
    if len(raw) != size:
        raise BadInput(f"{p}: not a safetensors file (the file ended inside its {size:,}-byte header)")
    header = loads_json(raw, p, "a safetensors header")
    if not isinstance(header, dict):
        raise BadInput(f"{p}: a safetensors header must be a JSON object")
    data_len = file_size - 8 - size
    tensors: dict[str, dict] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        problem = _tensor_problem(info, data_len)
        if problem is not None:
            raise BadInput(f"{p}: safetensors header: tensor {name!r} {problem}")
        tensors[name] = info
    return tensors


def safetensors_shortfall(path: str | Path) -> tuple[int, int] | None:
    """``(file bytes, bytes its header needs)`` when a safetensors file is shorter than its own
    header says (a partial download or copy: the header length, or a tensor's data_offsets end,
    past the end of the file; safetensors' loader refuses it, ``MetadataIncompleteBuffer``);
    ``None`` when it is long enough or its header says nothing usable, such as a file under
    the 8 bytes of the header length (``safetensors_header`` names that). Raises ``OSError`` when the file cannot be read."""
    from escha_deploy.utils.errors import BadInput
    from escha_deploy.utils.jsonio import loads_json

    with open(path, "rb") as fh:
        file_size = os.fstat(fh.fileno()).st_size
        head = fh.read(8)
        if len(head) < 8:  # not a safetensors file at all: safetensors_header names it
            return None
        n = int.from_bytes(head, "little")
        if not 0 < n <= MAX_SAFETENSORS_HEADER:
            return None
        if n > file_size - 8:
            return file_size, 8 + n
        raw = fh.read(n)
    try:
        header = loads_json(raw, path, "a safetensors header")
    except BadInput:
        return None
    if not isinstance(header, dict):
        return None
    ends = [info["data_offsets"][1] for name, info in header.items() if name != "__metadata__"
            and isinstance(info, dict) and isinstance(info.get("data_offsets"), list)
            and len(info["data_offsets"]) == 2 and isinstance(info["data_offsets"][1], int)]
    need = 8 + n + max(ends, default=0)
    return (file_size, need) if need > file_size else None


def safetensors_tensor_bytes(path: str | Path, contains: str) -> int:
    """Bytes of the tensors of one safetensors file whose name contains ``contains``, from its
    checked header (``safetensors_header``: every tensor of it is checked, not only those
    counted). Raises as ``safetensors_header``."""
    total = 0
    for name, info in safetensors_header(path).items():
        if contains in name:
            begin, end = info["data_offsets"]
            total += end - begin
    return total


def safetensors_header_weights(files: list[Path]) -> tuple[int, int]:
    """``(model_bytes, mtp_bytes)`` of the tensors in ``files``, from their checked headers
    (``safetensors_header``): per tensor its data_offsets span, equal there to
    ``SAFETENSORS_DTYPE_BITS[dtype] x prod(shape) / 8``, what the tensor holds, never the header
    or padding the file sizes include; tensors whose name contains ``mtp`` counted apart
    (SGLang's target skips them, a NEXTN draft loads them: ``MTP_ONE_LAYER_ARCHITECTURES``).
    Raises as ``safetensors_header``, for the first file that does not pass."""
    model = mtp = 0
    for f in files:
        for name, info in safetensors_header(f).items():
            begin, end = info["data_offsets"]
            if "mtp" in name:
                mtp += end - begin
            else:
                model += end - begin
    return model, mtp


def read_draft_dir(path: str | Path, model_folder: str | Path | None = None) -> DraftFacts | None:
    """Read a speculative-decoding draft's folder: its config.json (the layer count,
    ``draft_num_layers``) and its weight bytes: the sum of ``*.safetensors`` sizes, or, when
    it is the model's own folder (``model_folder``, the same folder by inode), the bytes of its
    MTP tensors (names containing ``mtp``, from the safetensors headers), which is all the draft
    loads (``MTP_ONE_LAYER_ARCHITECTURES``). ``None`` when the folder does not exist here.
    Raises ``BadInput`` (config.json or a header unreadable) or ``ValueError`` (a config.json of
    the wrong shape), as ``read_model_dir``."""
    from escha_deploy.utils.jsonio import is_regular_file, loads_json, read_regular

    p = Path(path)
    if not os.path.isdir(p):
        return None
    own = False
    if model_folder is not None and os.path.isdir(model_folder):
        own = os.path.samefile(p, model_folder)
    layers: tuple[int, str] | None = None
    geometry: tuple[int | None, int | None, int] = (None, None, 0)
    cfg = p / "config.json"
    raw = read_regular(cfg, "the draft model's config.json", missing_ok=True)
    if raw is not None:
        try:
            config = loads_json(raw, cfg, "the draft model's config.json", bom=False)
            layers = draft_num_layers(config)
            geometry = draft_kv_geometry(config)
        except ValueError as exc:
            raise ValueError(f"{cfg}: {exc}") from None
    files = sorted(f for f in p.glob("*.safetensors") if is_regular_file(f))
    weights: int | None = None
    wsrc = ""
    if own:
        weights = sum(safetensors_tensor_bytes(f, "mtp") for f in files) if files else None
        wsrc = "the MTP tensors (names with 'mtp') in the model's own safetensors headers"
        weights = weights or None  # no MTP tensor: nothing SGLang's MTP draft would load is known here
    elif files:
        weights = sum(f.stat().st_size for f in files)
        wsrc = f"safetensors in {p}"
    return DraftFacts(path=str(p), own_folder=own, weights_bytes=weights, weights_source=wsrc,
                      num_layers=layers[0] if layers else None, layers_source=layers[1] if layers else "",
                      kv_heads=geometry[0], head_dim=geometry[1], nextn_layers=geometry[2])
