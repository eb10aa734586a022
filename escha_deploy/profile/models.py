"""The profile models: typed, frozen descriptions of a box, a model and how to serve it.

A profile is YAML (``profiles/*.yaml``) validated into ``Profile`` by ``profile.loading``.

How to add a field: add it to the section model below as
``name: Annotated[type, Field(description=..., ge=...), SGLangFlag("--flag")] = DEFAULT``, with
the unit and the default in the description and the SGLang flag (or environment variable) it
feeds as ``SGLangFlag`` metadata (use the flag's ``dest`` as the name when it maps 1:1 to a
flag); if it reaches the server, render it in ``flags.py`` only, by key (``key_flag("section.name")``:
the metadata is the flag's one spelling, ``tests/test_flags_once.py``); add it to the commented
reference profile ``profiles/rtx5060ti-tp2.yaml`` (a test checks the docs). A rule that needs
the profile alone goes in ``profile.rules``.
"""

# No `from __future__ import annotations` here: pydantic would evaluate every string annotation
# of these models at class creation (typing._eval_type), about half of this module's import
# time, on every command that plans (docs/performance.md).

import typing
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union

from pydantic import (BaseModel, ConfigDict, Field, PrivateAttr, Strict, StrictInt, WithJsonSchema, field_validator,
                      model_validator)
from pydantic.fields import FieldInfo

from ..sglang.arch import ModelArch
from ..sglang.capabilities import CapabilityName
from ..utils.units import MAX_HICACHE_GB, hicache_gb_field, parse_size, size_field
from . import thresholds as _th


@dataclass(frozen=True)
class SGLangFlag:
    """What a profile key feeds SGLang, as field metadata
    (``Annotated[StrictInt, Field(...), SGLangFlag("--tp-size")]``): the one place that says which flag
    (``flag``, as SGLang 0.5.19's ``srt/server_args.py`` spells it) or environment variable
    (``env``) a key sets. ``secret``: the value is a credential (never in an argv, a log or an
    error line); ``url``: the value is an address or URL (its userinfo is masked and its host
    checked). ``profiles show --keys`` and the ``runtime.extra_args`` rule read it."""

    flag: str | None = None
    env: str | None = None
    secret: bool = False
    url: bool = False


def sglang_flag(field: FieldInfo) -> SGLangFlag | None:
    """The ``SGLangFlag`` metadata of a model field, if it has one."""
    return next((m for m in field.metadata if isinstance(m, SGLangFlag)), None)


#: The one flag of ``hicache.l3.kind``, whichever L3 model (``L3File``, ``L3Mooncake``,
#: ``L3Other``) the union picks.
_L3_KIND = SGLangFlag("--hicache-storage-backend")


Size = Annotated[int, size_field()]
#: A float key: a number only (pydantic's strict float: an int is taken, ``true`` and ``"1.5"`` are
#: not), finite (``EschaModel``'s ``allow_inf_nan=False``); its spelling in YAML is checked where the
#: file is read (``yamlpos``: ``1_5``, ``0b1010``, ``1:30`` refused, ``2e9`` read as the number). The
#: same rules as ``units.parse_number``, which reads the command-line options' numbers.
Number = Annotated[float, Strict()]

# Defaults of the safety policy (docs/planner.md): a starting point, to be calibrated from
# real runs. Printed with every plan.
DEFAULT_SERVER_PROCESS_PER_RANK = "3GiB"
DEFAULT_OS_RESERVE = "1GiB"
DEFAULT_PAGE_CACHE_FLOOR = "2GiB"
DEFAULT_RECOMMEND_HEADROOM = "64MiB"
DEFAULT_RATIO_STEP = 0.05
DEFAULT_MAX_RATIO = 4.0
# About 1.31 GiB per GPU is held by WDDM/GPU-PV under WSL2
# (club-3090 docs/HARDWARE.md, cross-checked on two WSL2 machines).
DEFAULT_WSL2_HIDDEN_VRAM = "1.31GiB"
# Under WSL2 on consumer Blackwell (sm_12x) SGLang's device overhead is larger than on Linux
# (hidden reservations and residency limits: microsoft/WSL#40401, #41176; lowering the engine's
# fraction from 0.88 to 0.80 removed the residency failures there): the plan lowers SGLang's
# default mem_fraction_static by this much there, unless the profile sets the fraction.
DEFAULT_WSL2_MEM_FRACTION_DROP = 0.08
# CUDA context + NCCL before weights load; SGLang measures free memory after init
# (srt/distributed/bootstrap.py: init_torch_distributed). An estimate to calibrate.
DEFAULT_CUDA_CONTEXT = "512MiB"

# Upper bounds: far above any box this tool serves, low enough that a typo (an extra zero run,
# 1e9 for 1.5) is refused at the field instead of ending in an overflow or a search that runs
# for minutes in the planner.
#: GPUs in one box (an HGX host has 8; 64 leaves room for anything with one kernel).
MAX_GPUS = 64
#: Tokens: context, KV pool, prefix/recent windows (2**31: SGLang's token indices are int32).
MAX_TOKENS = 2**31 - 1
#: Host pool / device pool; the same cap as ``plan --ratio``.
MAX_RATIO = 100.0
#: Finest grid of the recommended-ratio search (the planner bisects it: at most
#: log2(MAX_RATIO / MIN_RATIO_STEP) + 1 = 18 pool evaluations).
MIN_RATIO_STEP = 0.001
#: Tokens per second: the floor of a prefill rate. A GPU that prefills fewer than one token a
#: second serves nothing; below it a typo (``1e-320``, a subnormal float) would be printed as a
#: restore cost of 1e-321 tokens/s.
MIN_PREFILL_TOKENS_PER_S = 1.0
#: Seconds: a week.
MAX_SECONDS = 7 * 24 * 3600
#: An image reference in the grammar of Docker's distribution/reference (``reference/regexp.go``):
#: ``[domain/]path[:tag][@digest]``, the path lowercase, a domain only when it has a dot, a port
#: or is localhost (else the first part is a path, as ``ParseNormalizedNamed`` reads it).
#: Refused here in one line rather than as a docker-py exception (an empty name raised
#: ``NullResource``, ``UPPER/x`` a 400 "invalid reference format").
_DC = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DC}(?:\.{_DC})+(?::[0-9]+)?|{_DC}:[0-9]+|localhost)"
_PATH = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_REF = (rf"^(?:{_DOMAIN}/)?{_PATH}(?:/{_PATH})*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?"
             r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$")


class EschaModel(BaseModel):
    """Base of every user-facing model: frozen, and unknown keys are errors, because a typo
    in a profile must fail instead of being silently ignored (dstack's CoreModel)."""

    # inf and nan are refused for every float field (YAML reads .inf and .nan as floats).
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


@dataclass(frozen=True)
class OmitWhenUnset:
    """Field metadata: ``profile_to_data`` leaves the key out while it is ``None``. For keys
    added after launch specs were digested and rendered: a profile that does not set the key
    keeps its plan digest (``launch_spec.launch_digest`` is over ``profile_to_data``), so a
    running server does not read as stale after an upgrade, and its rendered profile (the
    Kubernetes ConfigMap) stays as it was. ``profiles show --keys`` still lists the key."""


class Hardware(EschaModel):
    gpu_name: Annotated[str, Field(description="GPU model, e.g. 'GeForce RTX 5060 Ti'")]
    gpu_count: Annotated[StrictInt, Field(gt=0, le=MAX_GPUS, description="GPUs in the box")]
    gpu_vram: Annotated[Size, Field(gt=0, description="VRAM per GPU (e.g. 12GiB), as nvidia-smi memory.total")]
    compute_capability: Annotated[str | None, Field(description="e.g. '12.0' (sm_120)")] = None
    platform: Annotated[
        Literal["linux", "wsl2", "any"],
        Field(description="the platform this profile is written for; plans use the host's"),
    ] = "any"
    host_ram: Annotated[
        Size | None,
        Field(gt=0, description="the host memory this profile was sized for: MemTotal as the server's kernel sees "
              "it (under WSL2 the VM's, e.g. 16GiB of a 32 GB Windows host); plans use the host's own, and a plan "
              "that is unsafe says from which MemTotal the profile fits as it is; none: not stated"),
        OmitWhenUnset(),
    ] = None


class DraftModel(EschaModel):
    """A speculative-decoding draft model's folder (``runtime.speculative.algorithm`` names the
    algorithm). Like ``model``: ``path`` is the folder as the server sees
    it, ``host_dir`` the host folder mounted read-only there (a container) or loaded (natively)."""

    path: Annotated[str, Field(min_length=1, max_length=4096,
                               description="the draft folder as the server sees it (--speculative-draft-model-path); "
                               "for NEXTN/MTP drafting with the model's own MTP layers, model.path"),
                    SGLangFlag("--speculative-draft-model-path")]
    host_dir: Annotated[
        str | None,
        Field(max_length=4096, description="host folder of the draft, mounted read-only at model.draft.path; when "
              "present the plan counts the draft's weights (its safetensors / runtime.tp_size; the MTP tensors "
              "when it is the model's own folder) and its KV cache (config.json's layers), as SGLang sizes them"),
    ] = None


class Checkpoint(EschaModel):
    """The published checkpoint a profile was sized for (``model.checkpoint``): what `escha-deploy
    model pull PROFILE` fetches into ``model.host_dir``. ``repo`` is the hub repository id
    (OWNER/NAME), null where none is published (a fork's own weights); ``source`` says where the
    id comes from, or why there is none."""

    repo: Annotated[
        str | None,
        Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=200,
              description="hub repository id (OWNER/NAME) of the weights; null: none is published"),
    ]
    revision: Annotated[
        str | None, Field(max_length=200, description="branch, tag or commit to pull (default: main); the lock "
                          "file beside the weights pins the commit it resolved to")
    ] = None
    source: Annotated[str, Field(min_length=1, max_length=1000,
                                 description="where the repository id comes from, or why none is published")]


class ModelSection(EschaModel):
    path: Annotated[str, Field(description="model path as the server sees it (--model-path)"), SGLangFlag("--model-path")]
    host_dir: Annotated[
        str | None,
        Field(description="host folder of the model; when present, config.json and the "
              "safetensors sizes replace `architecture` and `weights_total`"),
    ] = None
    served_model_name: Annotated[str | None, Field(description="--served-model-name"), SGLangFlag("--served-model-name")] = None
    architecture: Annotated[ModelArch, Field(description="HF config.json fields the planner needs")]
    weights_total: Annotated[
        Size | None, Field(gt=0, description="device bytes of the weights of all TP ranks together (estimate when no "
                           "host_dir); each rank holds weights_total / runtime.tp_size")
    ] = None
    weights_per_rank: Annotated[
        Size | None, Field(gt=0, description="device bytes of weights per TP rank at this profile's runtime.tp_size "
                           "(estimate when no host_dir); prefer weights_total, which follows tp_size")
    ] = None
    quantization: Annotated[
        str | None, Field(description="--quantization (e.g. awq_marlin; escha_w2 needs w2-weights)"), SGLangFlag("--quantization")
    ] = None
    trust_remote_code: Annotated[bool, Field(description="--trust-remote-code"), SGLangFlag("--trust-remote-code")] = False
    checkpoint: Annotated[
        Checkpoint | None,
        Field(description="the published checkpoint this profile was sized for: {repo, revision, source}; "
              "`escha-deploy model pull PROFILE` fetches it into host_dir and pins it (escha-model.lock.json)"),
        OmitWhenUnset(),
    ] = None
    draft: Annotated[
        DraftModel | None,
        Field(description="the speculative-decoding draft model: {path, host_dir} (--speculative-draft-model-path); "
              "the algorithm is runtime.speculative.algorithm; none: no draft folder named, "
              "and the plan says a draft is not counted"),
        OmitWhenUnset(),
    ] = None


class Int2Options(EschaModel):
    """OSCAR INT2 KV layout (our overlay's): 2-bit codes packed 4 per byte
    along head_dim, and (scale, zero) pairs per group in a second tensor."""

    group_size: Annotated[StrictInt, Field(gt=0, le=4096, description="--kv-cache-quant-group-size (elements)"), SGLangFlag("--kv-cache-quant-group-size")] = 64
    scale_dtype: Annotated[
        Literal["float32", "bfloat16", "float16"],
        Field(description="SGLANG_MIXED_KV_SCALE_DTYPE: dtype of each scale and zero"), SGLangFlag(env="SGLANG_MIXED_KV_SCALE_DTYPE")
    ] = "float32"
    hp_dtype: Annotated[
        Literal["bfloat16", "float16"],
        Field(description="SGLANG_MIXED_KV_HP_DTYPE: the high-precision sink/recent arena"), SGLangFlag(env="SGLANG_MIXED_KV_HP_DTYPE")
    ] = "bfloat16"
    prefix_tokens: Annotated[
        StrictInt, Field(ge=0, le=MAX_TOKENS, description="SGLANG_MIXED_KV_PREFIX_TOKENS: bf16 sink prefix (multiple of the page)"), SGLangFlag(env="SGLANG_MIXED_KV_PREFIX_TOKENS")
    ] = 64
    recent_tokens: Annotated[
        StrictInt, Field(ge=0, le=MAX_TOKENS, description="SGLANG_MIXED_KV_RECENT_TOKENS: bf16 recent window (multiple of the page)"), SGLangFlag(env="SGLANG_MIXED_KV_RECENT_TOKENS")
    ] = 256
    mixed_windows: Annotated[
        bool | None, Field(description="SGLANG_ENABLE_MIXED_KV_WINDOWS=1: build the fork's mixed HP+INT2 KV window (a "
                    "high-precision sink and recent-window arena beside the INT2 pool; hp_dtype, prefix_tokens and "
                    "recent_tokens size it). OSCAR-derived SGLang builds it only with this variable set and no "
                    "speculative decoding (model_executor/pool_configurator.py: _compute_cell_size); the fork "
                    "carries it but never builds it on a hybrid GDN model, so there it is refused. false or unset: "
                    "no arena counted, none of its variables rendered"),
        SGLangFlag(env="SGLANG_ENABLE_MIXED_KV_WINDOWS"), OmitWhenUnset(),
    ] = None


KvDtype = Literal["auto", "bf16", "bfloat16", "fp8_e4m3", "fp8_e5m2", "int2",
                  "mxfp8", "nvfp4", "fp4_mx_block16"]


#: KV dtypes a release's ``--kv-cache-dtype`` lists that its own code refuses, with SGLang's
#: reason: 0.5.19 lists ``fp4_e2m1`` (server_args.py) and refuses it when the model runner
#: resolves the dtype, after the weights load (srt/mem_cache/kv_cache_dtype.py:
#: ``configure_kv_cache_dtype``); 0.5.23 no longer lists it.
REFUSED_KV_DTYPES = {
    "fp4_e2m1": "SGLang refuses it: '--kv-cache-dtype=fp4_e2m1 is deprecated. Use --kv-cache-dtype=fp4_mx_block16.' "
                "(srt/mem_cache/kv_cache_dtype.py: configure_kv_cache_dtype); use fp4_mx_block16",
}


class KvCache(EschaModel):
    dtype: Annotated[KvDtype, Field(description="--kv-cache-dtype (int2 needs the int2-kv capability)"), SGLangFlag("--kv-cache-dtype")] = "auto"
    int2: Annotated[Int2Options, Field(description="INT2 layout, used when dtype is int2")] = Int2Options()

    @field_validator("dtype", mode="before")
    @classmethod
    def _refused_by_sglang(cls, value: Any) -> Any:
        if isinstance(value, str) and value in REFUSED_KV_DTYPES:
            raise ValueError(f"{value}: {REFUSED_KV_DTYPES[value]}")
        return value


#: ``--speculative-algorithm`` values SGLang 0.5.19 and 0.5.23 know built in
#: (``srt/speculative/spec_info.py: SpeculativeAlgorithm``; NEXTN is its alias of EAGLE,
#: ``arg_groups/speculative_hook.py: _resolve_speculative_algorithm_alias``).
SpeculativeAlgorithmName = Literal["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK"]


class Speculative(EschaModel):
    """Speculative decoding: the algorithm and the draft's shape, each key one SGLang flag. The
    draft's folder is ``model.draft``. Unset keys are left to SGLang, which picks them under the
    EAGLE family (``arg_groups/speculative_hook.py: _auto_choose_speculative_params``: 3 steps,
    top-k 1, 4 draft tokens for the Qwen3.x models) and sets ``--max-running-requests`` to 48
    when that is unset (``_handle_eagle_family``, ``_handle_ngram``, ...)."""

    algorithm: Annotated[
        SpeculativeAlgorithmName,
        Field(description="--speculative-algorithm (NEXTN drafts with the model's own MTP layers: name the "
              "model's own folder in model.draft)"), SGLangFlag("--speculative-algorithm")]
    num_steps: Annotated[StrictInt | None, Field(gt=0, le=64, description="--speculative-num-steps; unset: SGLang's"),
                         SGLangFlag("--speculative-num-steps")] = None
    eagle_topk: Annotated[StrictInt | None, Field(gt=0, le=64, description="--speculative-eagle-topk; unset: SGLang's"),
                          SGLangFlag("--speculative-eagle-topk")] = None
    num_draft_tokens: Annotated[
        StrictInt | None, Field(gt=0, le=1024, description="--speculative-num-draft-tokens: tokens verified per "
                                "step; SGLang keeps a mamba state per draft token per request on a hybrid model "
                                "(kv_cache_configurator.py: _handle_max_mamba_cache); unset: SGLang's"),
        SGLangFlag("--speculative-num-draft-tokens")] = None


class Runtime(EschaModel):
    sglang_version: Annotated[
        str | None, Field(pattern=r"^\d+\.\d+\.\d+$", max_length=32,
                          description="SGLang release the profile targets (one of escha_deploy/catalog/releases/index.yaml's); "
                          "unset: the image's release, else --sglang-version, else the default release")
    ] = None
    base_image: str = Field(
        pattern=IMAGE_REF, max_length=512, default_factory=lambda: _release_default("base_image", None),
        description="base image Dockerfile.hicache builds on; unset: the SGLang image of runtime.sglang_version "
                    "(else the default release): escha_deploy/catalog/releases/X.Y.Z/facts.yaml, image")
    needs: Annotated[
        list[CapabilityName],
        Field(description="runtime capabilities this profile needs; serve/up refuse a runtime lacking any"),
    ] = []
    tp_size: Annotated[StrictInt, Field(gt=0, le=MAX_GPUS, description="--tp-size"), SGLangFlag("--tp-size")] = 1
    context_length: Annotated[StrictInt | None, Field(gt=0, le=MAX_TOKENS, description="--context-length (tokens)"), SGLangFlag("--context-length")] = None
    allow_longer_context_length: Annotated[
        bool, Field(description="SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1: let context_length exceed what the "
                    "model's config.json allows (SGLang then warns of incorrect outputs or CUDA errors; without it "
                    "srt/configs/model_config.py: _derive_context_length refuses at start)"),
        SGLangFlag(env="SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"),
    ] = False
    max_total_tokens: Annotated[
        StrictInt | None, Field(gt=0, le=MAX_TOKENS, description="--max-total-tokens: device KV pool size (tokens)"), SGLangFlag("--max-total-tokens")
    ] = None
    min_total_tokens: Annotated[
        StrictInt | None,
        Field(ge=2, le=MAX_TOKENS, description="the fewest device KV tokens this profile can serve with: where SGLang "
              "would size the pool smaller (it caps a max_total_tokens that does not fit, "
              "mem_cache/kv_cache_configurator.py: _apply_token_constraints, or sizes it itself), the plan refuses, "
              "naming both figures. At least 2: SGLang stops on a smaller pool (managers/tp_worker.py: max_req_len "
              "must be above 0). Unset: any pool SGLang accepts"),
        OmitWhenUnset(),
    ] = None
    max_mamba_cache_size: Annotated[
        StrictInt | None, Field(gt=0, le=MAX_TOKENS, description="--max-mamba-cache-size: device mamba state slots"), SGLangFlag("--max-mamba-cache-size")
    ] = None
    max_running_requests: Annotated[StrictInt | None, Field(gt=0, le=MAX_TOKENS, description="--max-running-requests"), SGLangFlag("--max-running-requests")] = None
    page_size: Annotated[StrictInt | None, Field(gt=0, le=2**20, description="--page-size (tokens; 1 on CUDA by default)"), SGLangFlag("--page-size")] = None
    mem_fraction_static: Annotated[
        Number | None, Field(gt=0, lt=1, description="--mem-fraction-static; unset: SGLang's default"), SGLangFlag("--mem-fraction-static")
    ] = None
    chunked_prefill_size: Annotated[
        StrictInt | None, Field(ge=-1, le=MAX_TOKENS, description="--chunked-prefill-size (tokens; -1 disables chunking)"), SGLangFlag("--chunked-prefill-size")
    ] = None
    cuda_graph_max_bs: Annotated[StrictInt | None, Field(gt=0, le=2**16, description="--cuda-graph-max-bs-decode"), SGLangFlag("--cuda-graph-max-bs-decode")] = None
    disable_prefill_cuda_graph: Annotated[bool, Field(description="--disable-prefill-cuda-graph"), SGLangFlag("--disable-prefill-cuda-graph")] = False
    kv_cache: Annotated[KvCache, Field(description="KV cache dtype and layout")] = KvCache()
    mamba_ssm_dtype: Annotated[
        Literal["float32", "bfloat16", "float16"] | None,
        Field(description="--mamba-ssm-dtype; overrides the model's SSM state dtype"), SGLangFlag("--mamba-ssm-dtype")
    ] = None
    mamba_radix_cache_strategy: Annotated[
        Literal["auto", "no_buffer", "extra_buffer", "extra_buffer_lazy"],
        Field(description="--mamba-radix-cache-strategy"), SGLangFlag("--mamba-radix-cache-strategy")
    ] = "auto"
    enable_mixed_chunk: Annotated[bool, Field(description="--enable-mixed-chunk"), SGLangFlag("--enable-mixed-chunk")] = False
    disable_radix_cache: Annotated[bool, Field(description="--disable-radix-cache"), SGLangFlag("--disable-radix-cache")] = False
    enable_int8_mamba_checkpoint: Annotated[bool, Field(description="--enable-int8-mamba-checkpoint"), SGLangFlag("--enable-int8-mamba-checkpoint")] = False
    attention_backend: Annotated[str | None, Field(description="--attention-backend"), SGLangFlag("--attention-backend")] = None
    disable_custom_all_reduce: Annotated[
        bool | None,
        Field(description="--disable-custom-all-reduce; unset: on for TP >= 2 unless NVML facts prove "
                    "peer access between the TP GPUs (sgl-project/sglang#4814)"), SGLangFlag("--disable-custom-all-reduce")
    ] = None
    enable_cache_report: Annotated[bool, Field(description="--enable-cache-report (bench needs it)"), SGLangFlag("--enable-cache-report")] = True
    enable_metrics: Annotated[bool, Field(description="--enable-metrics (bench and the canary read it)"), SGLangFlag("--enable-metrics")] = True
    speculative: Annotated[
        Speculative | None,
        Field(description="speculative decoding {algorithm, num_steps, eagle_topk, num_draft_tokens}; none: off"),
        OmitWhenUnset(),
    ] = None
    extra_args: Annotated[
        list[str], Field(description="raw SGLang flags appended last; checked against the flag catalog; "
                         "no secrets (--api-key: use container.api_key_file)")
    ] = []

    @field_validator("sglang_version")
    @classmethod
    def _supported_release(cls, value: str | None) -> str | None:
        from ..sglang.releases import supported_releases

        if value is not None and value not in supported_releases():
            raise ValueError(f"SGLang {value} is not a supported release (supported: {', '.join(supported_releases())})")
        return value

    @field_validator("extra_args")
    @classmethod
    def _no_secrets_in_extra_args(cls, value: list[str]) -> list[str]:
        from ..utils.secretargs import extra_args_problems

        problems = extra_args_problems(value)
        if problems:
            raise ValueError("\n".join(problems))  # one line each (the error formatter splits them)
        return value


L3Kind = Literal["file", "sim", "mooncake", "hf3fs", "nixl", "aibrix", "dynamic", "eic", "simm", "mori", "shm"]


class L3File(EschaModel):
    """SGLang's file L3 backend (``HiCacheFile``, ``srt/mem_cache/hicache_storage.py``): pages
    as files in one host directory, which must outlive the container."""

    kind: Annotated[Literal["file"], Field(description="--hicache-storage-backend file"),
                    _L3_KIND]
    dir: Annotated[
        str | None,
        Field(description="host directory of the L3 files (SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR)"),
        SGLangFlag(env="SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"),
    ] = None
    max_size: Annotated[
        Size | None, Field(description="cap of the L3 files (SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE), e.g. 512GB"),
        SGLangFlag(env="SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE"),
    ] = None
    min_free_space: Annotated[
        Size | None,
        Field(description="free space SGLang keeps on the store's filesystem, evicting to hold it "
              "(SGLANG_HICACHE_FILE_BACKEND_MIN_FREE_SPACE; unset: SGLang's 0), e.g. 20GB; each rank's cap is "
              "clamped to the filesystem's size less it"),
        SGLangFlag(env="SGLANG_HICACHE_FILE_BACKEND_MIN_FREE_SPACE"),
    ] = None


class L3Mooncake(EschaModel):
    """Mooncake's distributed store (``srt/mem_cache/storage/mooncake_store/mooncake_store.py``,
    which reads ``MOONCAKE_MASTER`` and ``MOONCAKE_GLOBAL_SEGMENT_SIZE`` from the environment)."""

    kind: Annotated[Literal["mooncake"], Field(description="--hicache-storage-backend mooncake"),
                    _L3_KIND]
    master: Annotated[
        str | None, Field(description="the Mooncake master's HOST:PORT (MOONCAKE_MASTER)"),
        SGLangFlag(env="MOONCAKE_MASTER", url=True),
    ] = None
    global_segment_size: Annotated[
        Size | None, Field(description="host memory each instance gives the store (MOONCAKE_GLOBAL_SEGMENT_SIZE); "
                           "unset: SGLang's 4gb, 4 GiB"),
        SGLangFlag(env="MOONCAKE_GLOBAL_SEGMENT_SIZE"),
    ] = None


class L3Other(EschaModel):
    """Another SGLang L3 backend, by name (no settings of its own here)."""

    kind: Annotated[Literal["sim", "hf3fs", "nixl", "aibrix", "dynamic", "eic", "simm", "mori", "shm"],
                    Field(description="--hicache-storage-backend"), _L3_KIND]


L3 = Annotated[Union[L3File, L3Mooncake, L3Other], Field(discriminator="kind")]


class HiCache(EschaModel):
    enabled: Annotated[bool, Field(description="--enable-hierarchical-cache"), SGLangFlag("--enable-hierarchical-cache")] = True
    prefill_tokens_per_s: Annotated[Number | None, Field(
        ge=MIN_PREFILL_TOKENS_PER_S, le=1e9, description="cold prefill rate of this box with HiCache off (tokens/s): what a host-tier "
        "hit saves, for plan's host_hit_cost when `escha-deploy bench` has not measured it here; null: not known")] = None
    hicache_ratio: Annotated[
        Union[Literal["auto"], Annotated[Number, Field(gt=0, le=MAX_RATIO)]],
        Field(description="--hicache-ratio: host pool size / device pool size; auto: the "
              "recommended safe ratio"), SGLangFlag("--hicache-ratio")
    ] = "auto"
    hicache_size: Annotated[
        int, hicache_gb_field(),
        WithJsonSchema({"anyOf": [{"type": "integer", "minimum": 0, "maximum": MAX_HICACHE_GB},
                                  {"type": "string", "pattern": r"^\s*[0-9]{1,12}\s*([Gg][Bb])?\s*$"}]}),
        Field(ge=0, le=MAX_HICACHE_GB, description="--hicache-size in GB (1e9) per rank, written 30 or 30GB; "
              "0: use the ratio"), SGLangFlag("--hicache-size")
    ] = 0
    hicache_mem_layout: Annotated[
        Literal["layer_first", "page_first", "page_first_direct", "page_first_kv_split", "page_head"],
        Field(description="--hicache-mem-layout (hybrid models need page_first or page_first_direct)"), SGLangFlag("--hicache-mem-layout")
    ] = "page_first"
    hicache_io_backend: Annotated[
        Literal["direct", "kernel", "kernel_ascend"], Field(description="--hicache-io-backend"), SGLangFlag("--hicache-io-backend")
    ] = "kernel"
    hicache_host_memory_mode: Annotated[
        Literal["cache", "buffer_only"], Field(description="--hicache-host-memory-mode"), SGLangFlag("--hicache-host-memory-mode")
    ] = "cache"
    hicache_write_policy: Annotated[
        Literal["write_back", "write_through", "write_through_selective"],
        Field(description="--hicache-write-policy"), SGLangFlag("--hicache-write-policy")
    ] = "write_through"
    host_mamba_slots: Annotated[
        Union[Literal["auto"], Annotated[StrictInt, Field(ge=1, le=1_000_000)], None],
        Field(description="host mamba states per rank apart from the ratio (ESCHA_HICACHE_HOST_MAMBA_SLOTS, "
              "patch 0004: capability hicache-host-mamba-slots); auto: what hicache.workload's two passes take "
              "(planner/reach.py); null: SGLang's device slots x ratio. The planner renders the variable"),
    ] = None
    workload: Annotated[
        str | None,
        Field(description="the prefixes this box should bring back, COUNTxTOKENS (8x18000: 8 distinct "
              "18,000-token prefixes, each asked again): plan's host-tier reachability and "
              "host_mamba_slots: auto; `plan --workload` overrides"),
    ] = None
    l3: Annotated[
        L3 | None,
        Field(description="the L3 (storage) tier behind host RAM, by kind: {kind: file, dir, max_size}, "
              "{kind: mooncake, master, global_segment_size}, or another SGLang backend by name; none: host RAM "
              "only. The flat keys hicache_storage_backend, storage_dir and storage_max_size are read into it "
              "(with a warning)"),
    ] = None
    max_ratio: Annotated[
        Number, Field(gt=0, le=MAX_RATIO, description=f"cap on the recommended ratio (default {DEFAULT_MAX_RATIO})")
    ] = DEFAULT_MAX_RATIO
    min_ratio: Annotated[
        Number,
        Field(gt=0, le=MAX_RATIO, description="auto: below this ratio HiCache is turned off (a host pool no "
              "larger than the device pool reduces L2 effectiveness, SGLang's own warning)"),
    ] = 1.0

    #: Flat keys the input used (``hicache_storage_backend`` ...), read into ``l3``; and those
    #: that had nowhere to go (a directory without the file backend). Set by ``_flat_l3_keys``;
    #: the warnings of ``profile.rules`` name them.
    _flat_keys: tuple[str, ...] = PrivateAttr(default=())
    _ignored_keys: tuple[str, ...] = PrivateAttr(default=())

    @model_validator(mode="wrap")
    @classmethod
    def _flat_l3_keys(cls, data: Any, handler: Any) -> Any:
        """Read the flat L3 keys into ``l3`` (``l3_from_flat``)."""
        flat: tuple[str, ...] = ()
        ignored: tuple[str, ...] = ()
        if isinstance(data, dict):
            data, flat, ignored = l3_from_flat(data)
        out = handler(data)
        out._flat_keys, out._ignored_keys = flat, ignored
        return out

    @field_validator("workload")
    @classmethod
    def _workload_form(cls, v: str | None) -> str | None:
        """``COUNTxTOKENS`` (``planner.reach.parse_workload``'s form), checked here so a typo is
        one line naming the key."""
        if v is not None:
            from .workload import parse_workload

            parse_workload(v)
        return v

    @property
    def hicache_storage_backend(self) -> str | None:
        """The L3 backend's SGLang name (``--hicache-storage-backend``), ``None`` without L3."""
        return self.l3.kind if self.l3 is not None else None

    @property
    def storage_dir(self) -> str | None:
        """The file L3 backend's host directory (``l3.dir``); ``None`` for other backends."""
        return self.l3.dir if isinstance(self.l3, L3File) else None

    @property
    def storage_max_size(self) -> int | None:
        """The file L3 backend's cap in bytes (``l3.max_size``); ``None`` for other backends."""
        return self.l3.max_size if isinstance(self.l3, L3File) else None

    @property
    def storage_min_free(self) -> int:
        """The file L3 backend's free-space watermark in bytes (``l3.min_free_space``; SGLang's
        default 0)."""
        return int(self.l3.min_free_space or 0) if isinstance(self.l3, L3File) else 0

    @property
    def storage_backend_is_file(self) -> bool:
        """HiCache on with the file L3 backend (whose directory the plan checks)."""
        return self.enabled and self.hicache_storage_backend == "file"


#: The flat L3 keys and the ``l3`` key each is read into (``None``: the backend's kind).
FLAT_L3_KEYS: dict[str, str] = {"hicache_storage_backend": "kind", "storage_dir": "dir", "storage_max_size": "max_size"}


def l3_from_flat(hicache: dict[str, Any]) -> tuple[dict[str, Any], tuple[str, ...], tuple[str, ...]]:
    """A raw ``hicache`` mapping with the flat L3 keys read into ``l3``: ``(mapping, flat keys
    used, flat keys ignored)``. ``hicache_storage_backend: X`` makes ``l3`` of kind ``X`` (``null``:
    no L3), keeping ``l3``'s own keys when the kind stays; with the file backend ``storage_dir``
    and ``storage_max_size`` become its ``dir`` and ``max_size`` (over ``l3``'s: a flat key comes
    from a ``--set`` or a child profile); with another backend, or none, they configure nothing
    and are dropped (a warning names them)."""
    flat = tuple(k for k in FLAT_L3_KEYS if k in hicache)
    if not flat:
        return hicache, (), ()
    out = {k: v for k, v in hicache.items() if k not in FLAT_L3_KEYS}
    l3 = out.get("l3")
    l3 = dict(l3) if isinstance(l3, dict) else None
    if "hicache_storage_backend" in hicache:
        kind = hicache["hicache_storage_backend"]
        l3 = None if kind is None else ({**l3, "kind": kind} if l3 is not None and l3.get("kind") in (None, kind)
                                        else {"kind": kind})
    files = tuple(k for k in ("storage_dir", "storage_max_size") if k in hicache)
    ignored: tuple[str, ...] = ()
    if l3 is not None and l3.get("kind") == "file":
        l3.update({FLAT_L3_KEYS[k]: hicache[k] for k in files})
    else:
        ignored = tuple(k for k in files if hicache[k] is not None)
    out["l3"] = l3
    return out, flat, ignored


class Safety(EschaModel):
    """The safety policy (docs/planner.md): what must stay free of pinned host pools."""

    server_process_per_rank: Annotated[
        Size, Field(description="host memory one server rank uses outside the pinned pools "
                    f"(torch, CUDA context, tokenizer, scheduler); default {DEFAULT_SERVER_PROCESS_PER_RANK}")
    ] = parse_size(DEFAULT_SERVER_PROCESS_PER_RANK)
    os_reserve: Annotated[
        Size, Field(description=f"OS, Docker and escha-deploy; default {DEFAULT_OS_RESERVE}")
    ] = parse_size(DEFAULT_OS_RESERVE)
    page_cache_floor: Annotated[
        Size, Field(description="page cache kept (the seed's box swapped at 589 MB); "
                    f"default {DEFAULT_PAGE_CACHE_FLOOR}")
    ] = parse_size(DEFAULT_PAGE_CACHE_FLOOR)
    recommend_headroom: Annotated[
        Size, Field(description=f"headroom the recommended ratio leaves; default {DEFAULT_RECOMMEND_HEADROOM}")
    ] = parse_size(DEFAULT_RECOMMEND_HEADROOM)
    ratio_step: Annotated[
        Number, Field(ge=MIN_RATIO_STEP, le=1.0, description=f"grid of the recommended ratio; default {DEFAULT_RATIO_STEP}")
    ] = DEFAULT_RATIO_STEP
    wsl2_hidden_vram_per_gpu: Annotated[
        Size, Field(description=f"VRAM WSL2 keeps hidden per GPU; default {DEFAULT_WSL2_HIDDEN_VRAM}")
    ] = parse_size(DEFAULT_WSL2_HIDDEN_VRAM)
    cuda_context_per_gpu: Annotated[
        Size, Field(description=f"CUDA context and NCCL before weights load; default {DEFAULT_CUDA_CONTEXT}")
    ] = parse_size(DEFAULT_CUDA_CONTEXT)
    wsl2_mem_fraction_drop: Annotated[
        Number, Field(ge=0, le=0.5, description="under WSL2 with a compute capability 12.x card, how much the plan "
                     "lowers SGLang's default mem_fraction_static (beyond the hidden VRAM it subtracts) when "
                     "runtime.mem_fraction_static is not set: larger device overhead there (microsoft/WSL#40401, "
                     f"#41176); default {DEFAULT_WSL2_MEM_FRACTION_DROP}")
    ] = DEFAULT_WSL2_MEM_FRACTION_DROP


class Watch(EschaModel):
    """``status``'s alert thresholds (docs/launch.md "Watching a running box"); the defaults'
    sources are in ``escha_deploy/profile/thresholds.py``."""

    inert_min_requests: Annotated[StrictInt, Field(
        ge=1, le=1_000_000, description="finished requests with reuse a window needs before a host tier that is "
        f"written and never read counts as inert; default {_th.INERT_MIN_REQUESTS}")] = _th.INERT_MIN_REQUESTS
    swap_pages_per_s: Annotated[Number, Field(
        ge=0, le=1e9, description="swap pages in + out per second (/proc/vmstat) above which the host is "
        f"swapping; default {_th.SWAP_PAGES_PER_S:g}")] = _th.SWAP_PAGES_PER_S
    psi_some_avg10: Annotated[Number, Field(
        ge=0, le=100, description="memory PSI some avg10 (percent) to alert at; default "
        f"{_th.PSI_SOME_AVG10:g} (systemd-oomd kills at 60)")] = _th.PSI_SOME_AVG10


class Container(EschaModel):
    image: str = Field(
        pattern=IMAGE_REF, max_length=512, default_factory=lambda: _release_default("image", None),
        description="image to run; unset: the one `escha-deploy build --hicache` tags for runtime.sglang_version "
                    "(else the default release): escha_deploy/catalog/releases/index.yaml, image_tags.hicache")
    port: Annotated[StrictInt, Field(gt=0, lt=65536, description="host port of the OpenAI-compatible API"), SGLangFlag("--port")] = 30000
    expose: Annotated[
        bool, Field(description="publish beyond 127.0.0.1 (needs api_key_file)")
    ] = False
    api_key_file: Annotated[
        str | None, Field(description="host file holding the API key (mounted read-only; never in argv)"), SGLangFlag("--api-key", secret=True)
    ] = None
    hf_token_file: Annotated[str | None, Field(description="host file holding the HF token"), SGLangFlag(env="HF_TOKEN", secret=True)] = None
    model_dir: Annotated[
        str | None, Field(description="host folder mounted read-only at model.path "
                          "(default: model.host_dir)")
    ] = None
    hf_cache_dir: Annotated[str | None, Field(description="host HF cache folder to mount")] = None
    gpus: Annotated[
        Union[Literal["all"], Annotated[list[Annotated[StrictInt, Field(ge=0, lt=MAX_GPUS)]],
                                        Field(max_length=MAX_GPUS)]],
        Field(description="'all' or device ids, at least runtime.tp_size of them (WSL2 supports only all; "
              "ids become CUDA_VISIBLE_DEVICES); [] requests no GPU"),
    ] = "all"
    keep_capabilities: Annotated[
        bool, Field(description="do not drop Linux capabilities (cannot be verified without a GPU here)")
    ] = False
    stop_timeout_s: Annotated[StrictInt, Field(gt=0, le=MAX_SECONDS, description="SIGTERM grace before kill (seconds)")] = 60
    ready_timeout_s: Annotated[StrictInt, Field(gt=0, le=MAX_SECONDS, description="how long `up` waits for ready (seconds)")] = 1800
    nccl_p2p_disable: Annotated[
        bool | None,
        Field(description="NCCL_P2P_DISABLE=1; unset: on under WSL2 and where NVML shows the TP GPUs "
                    "without peer access (a GeForce/Titan brand or a P2P status other than ok; NVIDIA/nccl#1637, "
                    "microsoft/WSL#12467)"), SGLangFlag(env="NCCL_P2P_DISABLE")
    ] = None


#: A profile name: it names the container ``escha-NAME``, so Docker's container-name rule
#: applies (``daemon/names``: ``[a-zA-Z0-9][a-zA-Z0-9_.-]``), kept to 63 characters.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
#: ``NAME_PATTERN`` in words, for the error line.
NAME_RULE = "names are letters, digits, '_', '.', '-' (at most 63, starting with a letter or digit)"


def _release_default(key: Literal["image", "base_image"], release: str | None) -> str:
    """The default of ``container.image`` (``image``: the tag ``escha-deploy build --hicache`` gives
    ``release``'s image) or ``runtime.base_image`` (``base_image``: ``release``'s SGLang image), from
    the release data (``releases.image_tag``, ``releases.official_image``); ``release`` None: the
    default release."""
    from ..sglang.releases import image_tag, official_image

    return image_tag("hicache", release) if key == "image" else official_image(release)


def _release_images(data: Any) -> Any:
    """``data`` (a profile mapping, before validation) with ``container.image`` and
    ``runtime.base_image`` filled in where unset, for the release ``runtime.sglang_version`` names:
    a profile of a release runs, and builds on, that release's images. Left alone when the
    release is not a supported one (its own field reports that) or the sections are not mappings."""
    from ..sglang.releases import supported_releases

    if not isinstance(data, dict):
        return data
    runtime, container = data.get("runtime", {}), data.get("container", {})
    if isinstance(runtime, Runtime):
        runtime = runtime.model_dump(exclude_unset=True)
    if isinstance(container, Container) or not isinstance(runtime, dict) or not isinstance(container, dict):
        return data
    release = runtime.get("sglang_version")
    if release is None or not isinstance(release, str) or release not in supported_releases():
        return data
    data = dict(data)
    if "image" not in container:
        data["container"] = {**container, "image": _release_default("image", release)}
    if "base_image" not in runtime and isinstance(data.get("runtime"), dict):
        data["runtime"] = {**runtime, "base_image": _release_default("base_image", release)}
    return data


class Profile(EschaModel):
    """One deployable configuration: box, model, runtime, HiCache, safety policy, container.

    ``container.image`` and ``runtime.base_image`` default to the images of the release
    ``runtime.sglang_version`` names, else of the default release."""

    name: Annotated[str, Field(
        pattern=NAME_PATTERN,
        description="profile name (default: the file's stem); it names the container escha-NAME, so "
                    "Docker's rule applies: letters, digits, _ . -, at most 63")]
    description: Annotated[str, Field(description="one line for `profiles list`")] = ""
    hardware: Hardware
    model: ModelSection
    runtime: Runtime = Field(default_factory=lambda: Runtime())
    hicache: HiCache = HiCache()
    safety: Safety = Safety()
    watch: Watch = Watch()
    container: Container = Field(default_factory=lambda: Container())

    @model_validator(mode="before")
    @classmethod
    def _images_of_the_release(cls, data: Any) -> Any:
        return _release_images(data)


def normalize_kv_dtype(dtype: str) -> str:
    """``auto``/``bfloat16`` -> ``bf16``; ``fp8_e5m2`` -> ``fp8_e4m3`` width class stays its name."""
    return {"auto": "bf16", "bfloat16": "bf16"}.get(dtype, dtype)


def is_size_field(field: FieldInfo) -> bool:
    """A field typed ``Size`` (or ``Size | None``): its validator is ``parse_size``."""
    def has(annotation: Any, metadata: Any = ()) -> bool:
        if any(getattr(m, "func", None) is parse_size for m in metadata):
            return True
        return any(has(a, getattr(a, "__metadata__", ())) for a in typing.get_args(annotation))

    return has(field.annotation, field.metadata)


def profile_to_data(profile: BaseModel, readable: bool = False) -> dict[str, Any]:
    """A profile as plain data that ``load_profile`` reads back to the same profile: like
    ``model_dump(mode="json")``, but sizes written with a unit (``12GiB``), since a bare number
    is refused on the way in. ``readable``: a size that is no whole unit as its shortest exact
    decimal (``1.31GiB``, ``units.fmt_size_readable``) instead of bytes (``1406601789B``, the
    form the plan digest is over). A key marked ``OmitWhenUnset`` is left out while ``None``."""
    from ..utils.units import fmt_size_exact, fmt_size_readable

    fmt = fmt_size_readable if readable else fmt_size_exact

    out: dict[str, Any] = {}
    for name, field in type(profile).model_fields.items():
        value = getattr(profile, name)
        if value is None and any(isinstance(m, OmitWhenUnset) for m in field.metadata):
            continue  # a key added since specs were digested, unset (OmitWhenUnset)
        if isinstance(value, BaseModel):
            out[name] = profile_to_data(value, readable)
        elif is_size_field(field) and isinstance(value, int):
            out[name] = fmt(value)
        else:
            out[name] = profile.__pydantic_serializer__.to_python(profile, mode="json", include={name})[name]
    return out


def profile_json_schema() -> dict[str, Any]:
    """The JSON schema of a profile, generated from the models (editors, docs, CI)."""
    return Profile.model_json_schema()


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """Every pydantic model inside an annotation (``Annotated``, ``Optional``, each member of a
    union such as ``L3``), in the order written."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _walk_keys(model: type[BaseModel], prefix: str, out: dict[str, SGLangFlag]) -> None:
    for name, field in model.model_fields.items():
        meta = sglang_flag(field)
        if meta is not None:
            out.setdefault(prefix + name, meta)
        for sub in _models_in(field.annotation):
            _walk_keys(sub, f"{prefix}{name}.", out)


_KEY_META: dict[str, SGLangFlag] = {}


def key_metadata() -> dict[str, SGLangFlag]:
    """Dotted profile key -> its ``SGLangFlag`` metadata, for every key of ``Profile`` that has
    one, the members of a union (``hicache.l3``: file, mooncake, other) included, in the models'
    field order. Built once, on first use."""
    if not _KEY_META:
        _walk_keys(Profile, "", _KEY_META)
    return _KEY_META


def key_flag(key: str) -> str:
    """The SGLang flag the profile key ``key`` (dotted, ``"runtime.tp_size"``) feeds, as its
    ``SGLangFlag`` metadata declares it: the one spelling of that flag in escha-deploy
    (``tests/test_flags_once.py``). Raises ``LookupError`` for a key that declares no flag."""
    meta = key_metadata().get(key)
    if meta is None or meta.flag is None:
        raise LookupError(f"profile key {key} declares no SGLang flag (SGLangFlag metadata)")
    return meta.flag


def key_env(key: str) -> str:
    """The environment variable the profile key ``key`` (dotted) sets, as its ``SGLangFlag``
    metadata declares it (``SGLangFlag(env=...)``). Raises ``LookupError`` for a key that declares
    none."""
    meta = key_metadata().get(key)
    if meta is None or meta.env is None:
        raise LookupError(f"profile key {key} declares no environment variable (SGLangFlag metadata)")
    return meta.env
