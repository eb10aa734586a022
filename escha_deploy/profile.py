"""Profiles: typed, frozen descriptions of a box, a model and how to serve it.

A profile is YAML (``profiles/*.yaml``) validated into ``Profile``. Loading is a staged
pipeline:

1. read the YAML with source positions (``yamlpos``);
2. resolve ``extends:`` by deep-merging raw mappings, parent first, child over parent, each key
   keeping the file:line it came from;
3. apply ``--set KEY=VALUE`` overrides (dotted path; the value is read as YAML);
4. validate the merged mapping once; every error becomes one line
   ``file:line: dotted.key: message``, all of them, sorted by line.

``load_profile()`` is the only way in and the only place that catches pydantic's
``ValidationError``. Callers never see pydantic's error type.

How to add a field: add it to the section model below as
``name: Annotated[type, Field(description=..., ge=...)] = DEFAULT``, with the unit, the
default and the SGLang flag it feeds in the description (use the flag's ``dest`` as the name
when it maps 1:1 to a flag); if it reaches the server, render it in ``flags.py`` only; add it to
the commented reference profile ``profiles/rtx5060ti-tp2.yaml`` (a test checks the docs).
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Annotated, Any, Literal, Sequence, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, WithJsonSchema, field_validator, model_validator

from .arch import ModelArch
from .capabilities import CAPABILITIES, IMAGE_HICACHE, CapabilityName
from .errors import BadInput, Refused
from .units import MAX_HICACHE_GB, hicache_gb_field, parse_size, size_field
from .yamlpos import Positions, load_yaml_with_positions, parse_yaml_text, position_of

Size = Annotated[int, size_field()]

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


class Hardware(EschaModel):
    gpu_name: Annotated[str, Field(description="GPU model, e.g. 'GeForce RTX 5060 Ti'")]
    gpu_count: Annotated[int, Field(gt=0, le=MAX_GPUS, description="GPUs in the box")]
    gpu_vram: Annotated[Size, Field(gt=0, description="VRAM per GPU (e.g. 12GiB), as nvidia-smi memory.total")]
    compute_capability: Annotated[str | None, Field(description="e.g. '12.0' (sm_120)")] = None
    platform: Annotated[
        Literal["linux", "wsl2", "any"],
        Field(description="the platform this profile is written for; plans use the host's"),
    ] = "any"


class ModelSection(EschaModel):
    path: Annotated[str, Field(description="model path as the server sees it (--model-path)")]
    host_dir: Annotated[
        str | None,
        Field(description="host folder of the model; when present, config.json and the "
              "safetensors sizes replace `architecture` and `weights_per_rank`"),
    ] = None
    served_model_name: Annotated[str | None, Field(description="--served-model-name")] = None
    architecture: Annotated[ModelArch, Field(description="HF config.json fields the planner needs")]
    weights_per_rank: Annotated[
        Size, Field(description="device bytes of weights per TP rank (estimate when no host_dir)")
    ]
    quantization: Annotated[
        str | None, Field(description="--quantization (e.g. awq_marlin; escha_w2 needs w2-weights)")
    ] = None
    trust_remote_code: Annotated[bool, Field(description="--trust-remote-code")] = False


class Int2Options(EschaModel):
    """OSCAR INT2 KV layout (research/upstream.md section 2): 2-bit codes packed 4 per byte
    along head_dim, and (scale, zero) pairs per group in a second tensor."""

    group_size: Annotated[int, Field(gt=0, le=4096, description="--kv-cache-quant-group-size (elements)")] = 64
    scale_dtype: Annotated[
        Literal["float32", "bfloat16", "float16"],
        Field(description="SGLANG_MIXED_KV_SCALE_DTYPE: dtype of each scale and zero"),
    ] = "float32"
    hp_dtype: Annotated[
        Literal["bfloat16", "float16"],
        Field(description="SGLANG_MIXED_KV_HP_DTYPE: the high-precision sink/recent arena"),
    ] = "bfloat16"
    prefix_tokens: Annotated[
        int, Field(ge=0, le=MAX_TOKENS, description="SGLANG_MIXED_KV_PREFIX_TOKENS: bf16 sink prefix (multiple of the page)")
    ] = 64
    recent_tokens: Annotated[
        int, Field(ge=0, le=MAX_TOKENS, description="SGLANG_MIXED_KV_RECENT_TOKENS: bf16 recent window (multiple of the page)")
    ] = 256


KvDtype = Literal["auto", "bf16", "bfloat16", "fp8_e4m3", "fp8_e5m2", "int2",
                  "mxfp8", "nvfp4", "fp4_mx_block16"]


class KvCache(EschaModel):
    dtype: Annotated[KvDtype, Field(description="--kv-cache-dtype (int2 needs the int2-kv capability)")] = "auto"
    int2: Annotated[Int2Options, Field(description="INT2 layout, used when dtype is int2")] = Int2Options()


class Runtime(EschaModel):
    sglang_version: Annotated[Literal["0.5.19"], Field(description="SGLang release the profile targets")] = "0.5.19"
    base_image: Annotated[str, Field(pattern=IMAGE_REF, max_length=512, description="base image Dockerfile.hicache builds on")] = "lmsysorg/sglang:v0.5.19"
    needs: Annotated[
        list[CapabilityName],
        Field(description="runtime capabilities this profile needs; serve/up refuse a runtime lacking any"),
    ] = []
    tp_size: Annotated[int, Field(gt=0, le=MAX_GPUS, description="--tp-size")] = 1
    context_length: Annotated[int | None, Field(gt=0, le=MAX_TOKENS, description="--context-length (tokens)")] = None
    max_total_tokens: Annotated[
        int | None, Field(gt=0, le=MAX_TOKENS, description="--max-total-tokens: device KV pool size (tokens)")
    ] = None
    max_mamba_cache_size: Annotated[
        int | None, Field(gt=0, le=MAX_TOKENS, description="--max-mamba-cache-size: device mamba state slots")
    ] = None
    max_running_requests: Annotated[int | None, Field(gt=0, le=MAX_TOKENS, description="--max-running-requests")] = None
    page_size: Annotated[int | None, Field(gt=0, le=2**20, description="--page-size (tokens; 1 on CUDA by default)")] = None
    mem_fraction_static: Annotated[
        float | None, Field(gt=0, lt=1, description="--mem-fraction-static; unset: SGLang's default")
    ] = None
    chunked_prefill_size: Annotated[
        int | None, Field(ge=-1, le=MAX_TOKENS, description="--chunked-prefill-size (tokens; -1 disables chunking)")
    ] = None
    cuda_graph_max_bs: Annotated[int | None, Field(gt=0, le=2**16, description="--cuda-graph-max-bs-decode")] = None
    disable_prefill_cuda_graph: Annotated[bool, Field(description="--disable-prefill-cuda-graph")] = False
    kv_cache: Annotated[KvCache, Field(description="KV cache dtype and layout")] = KvCache()
    mamba_ssm_dtype: Annotated[
        Literal["float32", "bfloat16", "float16"] | None,
        Field(description="--mamba-ssm-dtype; overrides the model's SSM state dtype"),
    ] = None
    mamba_radix_cache_strategy: Annotated[
        Literal["auto", "no_buffer", "extra_buffer", "extra_buffer_lazy"],
        Field(description="--mamba-radix-cache-strategy"),
    ] = "auto"
    enable_mixed_chunk: Annotated[bool, Field(description="--enable-mixed-chunk")] = False
    disable_radix_cache: Annotated[bool, Field(description="--disable-radix-cache")] = False
    enable_int8_mamba_checkpoint: Annotated[bool, Field(description="--enable-int8-mamba-checkpoint")] = False
    attention_backend: Annotated[str | None, Field(description="--attention-backend")] = None
    disable_custom_all_reduce: Annotated[
        bool | None,
        Field(description="--disable-custom-all-reduce; unset: on for TP >= 2 unless NVML facts prove "
                    "peer access between the TP GPUs (sgl-project/sglang#4814)"),
    ] = None
    enable_cache_report: Annotated[bool, Field(description="--enable-cache-report (bench needs it)")] = True
    enable_metrics: Annotated[bool, Field(description="--enable-metrics (bench and the canary read it)")] = True
    extra_args: Annotated[
        list[str], Field(description="raw SGLang flags appended last; checked against the flag catalog; "
                         "no secrets (--api-key: use container.api_key_file)")
    ] = []

    @field_validator("extra_args")
    @classmethod
    def _no_secrets_in_extra_args(cls, value: list[str]) -> list[str]:
        from .secretargs import extra_args_problems

        problems = extra_args_problems(value)
        if problems:
            raise ValueError("\n".join(problems))  # one line each (_format_errors splits them)
        return value


class HiCache(EschaModel):
    enabled: Annotated[bool, Field(description="--enable-hierarchical-cache")] = True
    hicache_ratio: Annotated[
        Union[Literal["auto"], Annotated[float, Field(gt=0, le=MAX_RATIO)]],
        Field(description="--hicache-ratio: host pool size / device pool size; auto: the "
              "recommended safe ratio"),
    ] = "auto"
    hicache_size: Annotated[
        int, hicache_gb_field(),
        WithJsonSchema({"anyOf": [{"type": "integer", "minimum": 0, "maximum": MAX_HICACHE_GB},
                                  {"type": "string", "pattern": r"^\s*[0-9]{1,12}\s*([Gg][Bb])?\s*$"}]}),
        Field(ge=0, le=MAX_HICACHE_GB, description="--hicache-size in GB (1e9) per rank, written 30 or 30GB; "
              "0: use the ratio"),
    ] = 0
    hicache_mem_layout: Annotated[
        Literal["layer_first", "page_first", "page_first_direct", "page_first_kv_split", "page_head"],
        Field(description="--hicache-mem-layout (hybrid models need page_first or page_first_direct)"),
    ] = "page_first"
    hicache_io_backend: Annotated[
        Literal["direct", "kernel", "kernel_ascend"], Field(description="--hicache-io-backend")
    ] = "kernel"
    hicache_host_memory_mode: Annotated[
        Literal["cache", "buffer_only"], Field(description="--hicache-host-memory-mode")
    ] = "cache"
    hicache_write_policy: Annotated[
        Literal["write_back", "write_through", "write_through_selective"],
        Field(description="--hicache-write-policy"),
    ] = "write_through"
    hicache_storage_backend: Annotated[
        Literal["file", "sim", "mooncake", "hf3fs", "nixl", "aibrix", "dynamic", "eic", "simm", "mori", "shm"] | None,
        Field(description="--hicache-storage-backend (L3); none: host RAM only"),
    ] = None
    storage_dir: Annotated[
        str | None,
        Field(description="L3 file backend directory on the host (SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR)"),
    ] = None
    storage_max_size: Annotated[
        Size | None, Field(description="L3 file backend cap (SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE), e.g. 512GB")
    ] = None
    max_ratio: Annotated[
        float, Field(gt=0, le=MAX_RATIO, description=f"cap on the recommended ratio (default {DEFAULT_MAX_RATIO})")
    ] = DEFAULT_MAX_RATIO
    min_ratio: Annotated[
        float,
        Field(gt=0, le=MAX_RATIO, description="auto: below this ratio HiCache is turned off (a host pool no "
              "larger than the device pool reduces L2 effectiveness, SGLang's own warning)"),
    ] = 1.0

    @property
    def storage_backend_is_file(self) -> bool:
        """HiCache on with the file L3 backend (whose directory the plan checks)."""
        return self.enabled and self.hicache_storage_backend == "file"


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
        float, Field(ge=MIN_RATIO_STEP, le=1.0, description=f"grid of the recommended ratio; default {DEFAULT_RATIO_STEP}")
    ] = DEFAULT_RATIO_STEP
    wsl2_hidden_vram_per_gpu: Annotated[
        Size, Field(description=f"VRAM WSL2 keeps hidden per GPU; default {DEFAULT_WSL2_HIDDEN_VRAM}")
    ] = parse_size(DEFAULT_WSL2_HIDDEN_VRAM)
    cuda_context_per_gpu: Annotated[
        Size, Field(description=f"CUDA context and NCCL before weights load; default {DEFAULT_CUDA_CONTEXT}")
    ] = parse_size(DEFAULT_CUDA_CONTEXT)


class Container(EschaModel):
    image: Annotated[str, Field(pattern=IMAGE_REF, max_length=512, description="image to run; `escha-deploy build` tags escha-sglang:0.5.19-hicache by default")] = IMAGE_HICACHE
    port: Annotated[int, Field(gt=0, lt=65536, description="host port of the OpenAI-compatible API")] = 30000
    expose: Annotated[
        bool, Field(description="publish beyond 127.0.0.1 (needs api_key_file)")
    ] = False
    api_key_file: Annotated[
        str | None, Field(description="host file holding the API key (mounted read-only; never in argv)")
    ] = None
    hf_token_file: Annotated[str | None, Field(description="host file holding the HF token")] = None
    model_dir: Annotated[
        str | None, Field(description="host folder mounted read-only at model.path "
                          "(default: model.host_dir)")
    ] = None
    hf_cache_dir: Annotated[str | None, Field(description="host HF cache folder to mount")] = None
    gpus: Annotated[
        Union[Literal["all"], Annotated[list[Annotated[int, Field(ge=0, lt=MAX_GPUS)]],
                                        Field(max_length=MAX_GPUS)]],
        Field(description="'all' or device ids, at least runtime.tp_size of them (WSL2 supports only all; "
              "ids become CUDA_VISIBLE_DEVICES); [] requests no GPU"),
    ] = "all"
    keep_capabilities: Annotated[
        bool, Field(description="do not drop Linux capabilities (cannot be verified without a GPU here)")
    ] = False
    stop_timeout_s: Annotated[int, Field(gt=0, le=MAX_SECONDS, description="SIGTERM grace before kill (seconds)")] = 60
    ready_timeout_s: Annotated[int, Field(gt=0, le=MAX_SECONDS, description="how long `up` waits for ready (seconds)")] = 1800
    nccl_p2p_disable: Annotated[
        bool | None,
        Field(description="NCCL_P2P_DISABLE=1; unset: on under WSL2 and where NVML shows the TP GPUs "
                    "without peer access (a GeForce/Titan brand or a P2P status other than ok; NVIDIA/nccl#1637, "
                    "microsoft/WSL#12467)"),
    ] = None


#: A profile name: it names the container ``escha-NAME``, so Docker's container-name rule
#: applies (``daemon/names``: ``[a-zA-Z0-9][a-zA-Z0-9_.-]``), kept to 63 characters.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
#: ``NAME_PATTERN`` in words, for the error line.
NAME_RULE = "names are letters, digits, '_', '.', '-' (at most 63, starting with a letter or digit)"


class Profile(EschaModel):
    """One deployable configuration: box, model, runtime, HiCache, safety policy, container."""

    name: Annotated[str, Field(
        pattern=NAME_PATTERN,
        description="profile name (default: the file's stem); it names the container escha-NAME, so "
                    "Docker's rule applies: letters, digits, _ . -, at most 63")]
    description: Annotated[str, Field(description="one line for `profiles list`")] = ""
    hardware: Hardware
    model: ModelSection
    runtime: Runtime = Runtime()
    hicache: HiCache = HiCache()
    safety: Safety = Safety()
    container: Container = Container()

    @model_validator(mode="after")
    def _needs_known(self) -> "Profile":
        unknown = [n for n in self.runtime.needs if n not in CAPABILITIES]
        if unknown:  # pragma: no cover - Literal already refuses these
            raise ValueError(f"unknown capabilities {unknown}")
        return self


# --------------------------------------------------------------------------- loading


def _profiles_dir() -> Path:
    from .paths import profiles_dir

    return profiles_dir()


def list_profiles() -> list[str]:
    """Names of the shipped profiles (``profiles/*.yaml`` stems), sorted."""
    return sorted(p.stem for p in _profiles_dir().glob("*.yaml"))


#: Suffixes that make a profile reference a file path (JSON is read as the YAML it is).
PROFILE_FILE_SUFFIXES = (".yaml", ".yml", ".json")


def names_a_file(ref: str, relative_to: Path | None = None) -> bool:
    """Whether ``ref`` is read as a file rather than a shipped profile name: it ends with
    ``.yaml``, ``.yml`` or ``.json``, holds a path separator, or is an existing file whose
    name is not a shipped profile's (a shipped name wins over a file of the same name in the
    current folder: ``./NAME`` reads the file)."""
    if ref.endswith(PROFILE_FILE_SUFFIXES) or "/" in ref or os.sep in ref:
        return True
    if (_profiles_dir() / f"{ref}.yaml").is_file():
        return False
    return ((relative_to / ref) if relative_to is not None else Path(ref)).is_file()


def resolve_profile_path(ref: str, relative_to: Path | None = None) -> Path:
    """A profile name (``rtx5060ti-tp2``) or a path to a YAML/JSON file -> the file's path.

    ``names_a_file`` decides which; a relative path is taken from ``relative_to`` (the folder
    of the file that ``extends:`` it) or the current folder. Raises ``BadInput`` listing the
    known profiles when neither exists.
    """
    is_file = names_a_file(ref, relative_to)
    if is_file:
        c = Path(ref)
        if relative_to is not None and not c.is_absolute():
            c = relative_to / c
    else:
        c = _profiles_dir() / f"{ref}.yaml"
    if c.is_file():
        return c
    for d in (c, Path(ref)):
        if d.is_dir():
            found = sorted(p.name for p in d.glob("*.y*ml"))[:5]
            raise BadInput(f"{d}: is a directory, not a profile file",
                           hint=f"pass one of its YAML files: {', '.join(found)}" if found else
                           "pass a profile name or a profile YAML file")
    if is_file:
        raise BadInput(f"{c}: no such profile file")
    known = ", ".join(list_profiles()) or "(none)"
    raise BadInput(f"unknown profile {ref!r}: known profiles are {known}",
                   hint="or pass a path to a profile YAML file")


def _deep_merge(base: dict, over: dict, base_pos: Positions, over_pos: Positions, path: tuple) -> None:
    for key, value in over.items():
        kp = path + (key,)
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _deep_merge(base[key], value, base_pos, over_pos, kp)
        else:
            base[key] = copy.deepcopy(value)
            for p in [p for p in base_pos if p[: len(kp)] == kp]:
                del base_pos[p]
            for p, v in over_pos.items():
                if p[: len(kp)] == kp:
                    base_pos[p] = v
    if path in over_pos:
        base_pos.setdefault(path, over_pos[path])


def _load_raw(path: Path, seen: tuple[Path, ...], chain: list[str] | None = None) -> tuple[dict, Positions]:
    """Load one file and, recursively, what it extends; return the merged raw mapping.
    ``chain``: when given, the files read are appended to it, the root parent first and this
    file last (the order in which each overrides the one before)."""
    path = path.resolve()
    if path in seen:
        chain = " -> ".join(str(p) for p in seen + (path,))
        raise BadInput(f"{path}: extends itself: {chain}")
    data, pos = load_yaml_with_positions(path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise BadInput(f"{path}:1: a profile is a mapping of keys, not {type(data).__name__}")
    parent_ref = data.pop("extends", None)
    if parent_ref is None:
        if chain is not None:
            chain.append(str(path))
        return data, pos
    if not isinstance(parent_ref, str):
        line = pos.get(("extends",), (str(path), 1))[1]
        raise BadInput(f"{path}:{line}: extends: must be a profile name or path")
    try:
        parent_path = resolve_profile_path(parent_ref, relative_to=path.parent)
    except BadInput as exc:
        line = pos.get(("extends",), (str(path), 1))[1]
        raise BadInput(f"{path}:{line}: extends: {exc.message}", hint=exc.hint) from None
    merged, merged_pos = _load_raw(parent_path, seen + (path,), chain)
    if chain is not None:
        chain.append(str(path))
    # The child's own name/description never come from the parent.
    merged.pop("name", None)
    merged.pop("description", None)
    _deep_merge(merged, data, merged_pos, pos, ())
    return merged, merged_pos


def _apply_override(data: dict, pos: Positions, item: str) -> None:
    if "=" not in item:
        raise BadInput(f"--set {item}: expected KEY=VALUE (e.g. hicache.hicache_ratio=1.5)")
    key, _, raw = item.partition("=")
    keys = tuple(k for k in key.strip().split(".") if k)
    if not keys:
        raise BadInput(f"--set {item}: empty key")
    value, _ = parse_yaml_text(raw, f"--set {key}") if raw.strip() else (None, {})
    where = (f"--set {'.'.join(keys)}", 0)
    node = data
    for depth, k in enumerate(keys[:-1], start=1):
        child = node.get(k)
        if child is None:
            child = node[k] = {}
            # a section this override created is the override's, not the file's: an unknown
            # one (``--set server.tp_size=4``) is reported at the --set, not at the file's top
            pos[keys[:depth]] = where
        if not isinstance(child, dict):
            raise BadInput(f"--set {item}: {'.'.join(keys[:-1])} is not a mapping")
        node = child
    node[keys[-1]] = value
    for p in [p for p in pos if p[: len(keys)] == keys]:
        del pos[p]
    pos[keys] = where


def _strip_union_tags(loc: tuple) -> tuple:
    """pydantic puts the union member's tag into ``loc`` (e.g. ``'literal['auto']'``,
    ``'float'``); drop those so the path matches the YAML keys."""
    out = []
    for part in loc:
        if isinstance(part, str) and (part.startswith(("literal[", "function-")) or part in {
            "float", "int", "str", "list[int]", "constrained-float", "list[literal[", "bool",
        } or part.startswith("list[")):
            continue
        out.append(part)
    return tuple(out)


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside an annotation (``Annotated``, ``Optional``, unions), if any."""
    import typing

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _did_you_mean(loc: tuple, root: type[BaseModel] | None = None) -> str | None:
    """The closest known key to an unknown one at ``loc`` (difflib), for the error line.
    ``root``: the model at the top of ``loc`` (default ``Profile``); list indexes are skipped."""
    import difflib

    model: type[BaseModel] | None = root or Profile
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        if model is None or not isinstance(part, str) or part not in model.model_fields:
            return None
        model = _model_in(model.model_fields[part].annotation)
    if model is None or not isinstance(loc[-1], str):
        return None
    close = difflib.get_close_matches(loc[-1], list(model.model_fields), n=1, cutoff=0.75)
    return close[0] if close else None


def _format_errors(exc: ValidationError, pos: Positions, origin: str,
                   root: type[BaseModel] | None = None, name_from_file: bool = False) -> list[tuple[int, str]]:
    """One line per offending key: ``file:line: dotted.key: message (got value)``, sorted.

    A value that fails every member of a union (``auto`` or a number > 0) yields one error per
    member with the same key; they are joined into one line. ``name_from_file``: the profile's
    ``name`` is the file's stem (the file has no ``name:``), so a bad one says so in words.
    """
    by_loc: dict[tuple, dict] = {}
    for err in exc.errors(include_url=False):
        loc = _strip_union_tags(tuple(err["loc"]))
        if root is None and loc == ("name",) and err["type"] == "string_pattern_mismatch":
            # the regex is no help to a reader: say the rule, and where the name came from
            msg = (f"the profile name comes from the file name {err['input']!r}; {NAME_RULE}: add `name:`"
                   if name_from_file else f"{err['input']!r} is not a profile name: {NAME_RULE}")
        elif err["type"] == "extra_forbidden":
            msg = "unknown key"
        elif err["type"] == "missing":
            msg = "required key is missing"
        elif err["type"] == "model_type":  # a section given a scalar: say it in profile words, not pydantic's class names
            msg = f"expected a mapping of {'.'.join(str(p) for p in loc) or 'profile'} keys"
        else:
            msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            guess = _did_you_mean(loc, root)
            if guess:
                msg += f" (did you mean {guess}?)"
        entry = by_loc.setdefault(loc, {"msgs": [], "err": err, "types": []})
        entry["types"].append(err["type"])
        if msg not in entry["msgs"]:
            entry["msgs"].append(msg)
    # A union like ``'all' | list[int]`` fails on both members; when the list member names a
    # deeper item, the literal member's "Input should be 'all'" only hides it: drop that one.
    for loc in [l for l, e in by_loc.items() if all(er == "literal_error" for er in e["types"])]:
        if any(len(other) > len(loc) and other[: len(loc)] == loc for other in by_loc):
            del by_loc[loc]
    lines: list[tuple[str, int, str]] = []
    for loc, entry in by_loc.items():
        err = entry["err"]
        dotted = ".".join(str(p) for p in loc) or "(profile)"
        where = position_of(pos, loc)
        file, line = where if where else (origin, 0)
        got = err.get("input")
        msgs = entry["msgs"]
        prefix = "Input should be "
        if len(msgs) > 1 and all(m.startswith(prefix) for m in msgs):  # union members
            text = prefix + " or ".join(m.removeprefix(prefix) for m in msgs)
        else:
            text = " or ".join(msgs)
        got_s = ""
        named = loc == ("name",) and err["type"] == "string_pattern_mismatch"  # the message quotes it
        if (err["type"] != "missing" and not named and got is not None and not isinstance(got, (dict, list))
                and "(got" not in text and "did you mean" not in text):
            got_s = f" (got {_short_repr(got)})"
        where_s = f"{file}:{line}" if line else file
        # an override's place already names its key: "--set a.b: message", not "--set a.b: a.b: ..."
        key_s = "" if file == f"--set {dotted}" else f"{dotted}: "
        if file.startswith(f"--set {dotted}.") and text.startswith("unknown key"):
            # a section the override created: "--set server.tp_size: unknown key server"
            key_s, text = "", text.replace("unknown key", f"unknown key {dotted}", 1)
        for part in text.split("\n"):  # a validator's several problems: one line each
            lines.append((file, line, f"{where_s}: {key_s}{part}{got_s}"))
    lines.sort(key=lambda t: (t[0], t[1]))
    return [(ln, t) for _, ln, t in lines]


def _short_repr(value: Any, limit: int = 60) -> str:
    """``repr`` for an error line: at most ``limit`` characters; an int too long to print in
    decimal (Python refuses past 4300 digits) is named by its size."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        return f"an integer of {len(str(value)) if value.bit_length() < 14000 else 'thousands of'} digits"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def load_profile(ref: str, overrides: Sequence[str] = (), warnings: list[str] | None = None,
                 positions: Positions | None = None) -> Profile:
    """Load a profile by name or path, resolve ``extends:``, apply ``--set`` overrides,
    validate once.

    Raises ``BadInput`` (exit 2) with one line per problem, each naming file:line and the
    dotted key, for malformed YAML, unknown keys, bad units, bare numbers for sizes, values out
    of range, and unknown profiles (listing the known ones). ``warnings``: when given, one
    ``file:line: key: message`` line is appended per ``profile_only_warnings`` item (keys that
    load but do nothing). ``positions``: when given, filled with where each key was set: key
    path -> ``(file, line)``, or ``("--set a.b", 0)`` for an override (``key_source`` words it).
    """
    path = resolve_profile_path(ref)
    chain: list[str] = []
    data, pos = _load_raw(path, (), chain)
    if "name" not in data:
        # no `name:` in the file (nor in what it extends: a parent's name is never inherited):
        # the file's stem, and a problem with it is this file's, not the parent's
        data["name"] = path.stem
        pos[("name",)] = (str(path.resolve()), 0)
    stem_position = pos.get(("name",))
    for item in overrides:
        _apply_override(data, pos, item)
    try:
        profile = Profile.model_validate(data)
    except ValidationError as exc:
        from_file = pos.get(("name",)) == stem_position and stem_position == (str(path.resolve()), 0)
        raise BadInput(*[t for _, t in _format_errors(exc, pos, str(path), name_from_file=from_file)]) from None
    problems = [_blame(pos, chain, overrides, loc, msg, deps, str(path)) for loc, msg, deps in _cross_field_rules(profile)]
    if problems:
        raise BadInput(*[t for _, _, t in sorted(problems)])
    refusals = []
    for loc, msg in sglang_late_refusals(profile):
        file, line = position_of(pos, loc) or (str(path), 0)
        where = f"{file}:{line}" if line else file
        key = "" if file == f"--set {'.'.join(loc)}" else f"{'.'.join(loc)}: "  # "--set a.b: msg"
        refusals.append((file, line, f"{where}: {key}{msg}"))
    if refusals:  # SGLang accepts the arguments and stops later: a refusal before start, exit 3
        raise Refused(*[t for _, _, t in sorted(refusals)])
    if positions is not None:
        positions.update(pos)
    if warnings is not None:
        for loc, msg in profile_only_warnings(profile):
            file, line = position_of(pos, loc) or (str(path), 0)
            where = f"{file}:{line}" if line else file
            key = "" if file == f"--set {'.'.join(loc)}" else f"{'.'.join(loc)}: "
            warnings.append(f"{where}: {key}{msg}")
    return profile


def key_source(positions: Positions, loc: tuple[str, ...]) -> str | None:
    """Where the key ``loc`` itself was set, in words: ``file:line`` (the file that set it: a
    child profile's line, not its parent's, when the child overrides it) or ``--set a.b``;
    ``None`` when no file nor override set it (the model's default)."""
    where = positions.get(tuple(loc))
    if where is None:
        return None
    file, line = where
    return f"{file}:{line}" if line else file


def _blame(pos: Positions, chain: list[str], overrides: Sequence[str], loc: tuple, msg: str,
           deps: tuple[tuple, ...], origin: str) -> tuple[str, int, str]:
    """One cross-field problem as ``(file, line, text)``, placed where the user set a key it
    depends on (``loc`` itself or one of ``deps``): a ``--set`` first (``--set a.b=v: loc: msg``;
    ``--set loc: msg`` for ``loc``'s own), else the line of the most-derived profile file that
    set one (a child's line, not its parent's), ``loc`` first within a file; else ``loc``'s
    nearest ancestor (``yamlpos.position_of``)."""
    dotted = ".".join(loc)
    keys = [tuple(k) for k in (loc, *deps) if tuple(k) in pos]
    sets = [k for k in keys if pos[k][0].startswith("--set ")]
    if sets:
        k = sets[0]
        if k == tuple(loc):
            return (pos[k][0], 0, f"{pos[k][0]}: {msg}")
        key = ".".join(k)
        item = next((o.strip() for o in reversed(overrides)
                     if ".".join(p for p in o.partition("=")[0].strip().split(".") if p) == key), key)
        return (f"--set {key}", 0, f"--set {item}: {dotted}: {msg}")
    if keys:
        rank = {f: i for i, f in enumerate(chain)}
        k = max(keys, key=lambda k: rank.get(pos[k][0], -1))  # max keeps the first of equals: loc
        file, line = pos[k]
    else:
        file, line = position_of(pos, loc) or (origin, 0)
    where = f"{file}:{line}" if line else file
    return (file, line, f"{where}: {dotted}: {msg}")


def cross_field_problems(profile: Profile) -> list[tuple[tuple[str, ...], str]]:
    """Constraints between fields, as ``(key path, message)``: the GPUs the container gets must
    hold ``runtime.tp_size`` ranks (SGLang places one TP rank per visible GPU:
    ``srt/entrypoints/engine.py`` ``_launch_scheduler_processes`` gives rank ``i`` GPU
    ``base_gpu_id + i * gpu_id_step``), without repeats, and the box must have those ids."""
    return [(loc, msg) for loc, msg, _ in _cross_field_rules(profile)]


def _cross_field_rules(profile: Profile) -> list[tuple[tuple[str, ...], str, tuple[tuple[str, ...], ...]]]:
    """``cross_field_problems`` with, per problem, the other keys it depends on (``_blame``
    places the problem where the user set one of them)."""
    out: list[tuple[tuple[str, ...], str, tuple]] = []
    tp = profile.runtime.tp_size
    gpus = profile.container.gpus
    if gpus != "all" and gpus:  # []: no GPU requested (a stand-in server that needs none)
        if len(set(gpus)) != len(gpus):
            out.append((("container", "gpus"), f"device ids repeat: {gpus}", ()))
        elif len(gpus) < tp:
            out.append((("container", "gpus"), f"{len(gpus)} GPU(s) {gpus} cannot hold runtime.tp_size {tp} ranks",
                        (("runtime", "tp_size"),)))
        if any(g >= profile.hardware.gpu_count for g in gpus):
            out.append((("container", "gpus"),
                        f"device id {max(gpus)} but hardware.gpu_count is {profile.hardware.gpu_count}",
                        (("hardware", "gpu_count"),)))
    return out + _profile_only_rules(profile)


#: KV dtypes whose scale tensors SGLang 0.5.19's HiCache host pools never copy.
_SCALED_KV_DTYPES = ("mxfp8", "nvfp4", "fp4_mx_block16")


def extra_args_duplicating_keys(profile: Profile) -> list[tuple[tuple[str, ...], str]]:
    """Flags in ``runtime.extra_args`` that a profile key renders, as ``(key path, message)``.

    A flag passed raw would skip every rule on its key (``--enable-mixed-chunk`` in extra_args
    escaped the refusal of ``runtime.enable_mixed_chunk``), so the key must be used instead.
    The key-to-flag mapping is ``profile_keys.key_rows`` (the flag a key's description names,
    or the flag whose argparse destination is the key's name, as the SGLang 0.5.19 flag
    catalog has it); matching is by destination, so an alias or ``--flag=value`` is caught too.
    ``model.architecture.*`` keys describe the model and are not the rendered flag."""
    if not profile.runtime.extra_args:  # nothing to match: skip building the catalog and key map
        return []
    from . import capabilities as caps
    from .flagcheck import _parser_for
    from .profile_keys import _FLAG_IN_TEXT, key_rows

    # the catalog with every capability's declared flags (int2-kv's --kv-cache-quant-group-size)
    catalog = _parser_for(frozenset(caps.CAPABILITIES))
    key_of: dict[str, str] = {}
    for row in key_rows(profile):
        key = row["key"]
        if key == "runtime.extra_args" or key.startswith("model.architecture."):
            continue
        named = row["sglang_flag"].split(", ") + _FLAG_IN_TEXT.findall(row["description"])
        for flag in filter(lambda f: f in catalog.by_option, named):
            key_of.setdefault(catalog.by_option[flag].dest, key)
    out: list[tuple[tuple[str, ...], str]] = []
    for i, item in enumerate(profile.runtime.extra_args):
        opt = item.split("=", 1)[0]
        spec = catalog.by_option.get(opt) if opt.startswith("--") else None
        if spec is not None and spec.dest in key_of:
            key = key_of[spec.dest]
            out.append((("runtime", "extra_args"),
                        f"item {i}: {opt} is the flag of the profile key {key}; set {key} instead, so the rules "
                        "on that key apply"))
    return out


def profile_only_problems(profile: Profile) -> list[tuple[tuple[str, ...], str]]:
    """Rules that need the profile alone (no host facts, no architecture), as ``(key path,
    message)``: ``load_profile`` refuses them as bad input (exit 2) and ``profiles validate``
    prints each as ``file:line: key: message``. Rules that need host facts, the model's
    architecture or the runtime's capabilities are the planner's (planner/validate.py)."""
    return [(loc, msg) for loc, msg, _ in _profile_only_rules(profile)]


def _profile_only_rules(profile: Profile) -> list[tuple[tuple[str, ...], str, tuple[tuple[str, ...], ...]]]:
    """``profile_only_problems`` with, per problem, the other keys it depends on."""
    from .planner.kv import normalize_kv_dtype

    out: list[tuple[tuple[str, ...], str, tuple]] = []
    rt, hc, hw = profile.runtime, profile.hicache, profile.hardware
    if rt.tp_size > hw.gpu_count:
        out.append((("runtime", "tp_size"), f"tp_size {rt.tp_size} is larger than hardware.gpu_count {hw.gpu_count}",
                    (("hardware", "gpu_count"),)))
    out += [(loc, msg, ()) for loc, msg in extra_args_duplicating_keys(profile)]
    if not hc.enabled:
        return out
    on = (("hicache", "enabled"),)
    dtype = normalize_kv_dtype(rt.kv_cache.dtype)
    # HiCache with disable_radix_cache or enable_int8_mamba_checkpoint: SGLang refuses both while
    # resolving its arguments; the planner reports them (planner/validate.py), so the argument
    # oracle can hold them against SGLang's own check.
    if dtype in _SCALED_KV_DTYPES:
        out.append((("runtime", "kv_cache", "dtype"),
                    f"HiCache host pools never copy {dtype}'s scale tensors and size tokens at the wrong width: "
                    "restored prefixes would be corrupt; use fp8_e4m3 or bf16", on))
    sb = hc.hicache_storage_backend
    backend = ("hicache", "hicache_storage_backend")
    if hc.hicache_host_memory_mode == "buffer_only" and not sb:
        out.append((("hicache", "hicache_host_memory_mode"), "buffer_only needs an L3 storage backend", (backend,) + on))
    if sb and dtype == "int2":
        out.append((backend,
                    "L3 storage with INT2 KV: the flat data page carries the packed codes without their "
                    "scales/zeros (the INT2 host pool keeps them in separate tensors); remove the storage backend",
                    (("runtime", "kv_cache", "dtype"),) + on))
    if sb == "file" and not hc.storage_dir:
        out.append((("hicache", "storage_dir"),
                    "the file backend needs a host directory (it must outlive the container): set hicache.storage_dir",
                    (backend,) + on))
    return out


def profile_only_warnings(profile: Profile) -> list[tuple[tuple[str, ...], str]]:
    """Keys that load but do nothing, as ``(key path, message)``: warnings, not errors, printed
    by ``profiles validate`` (with file:line) and with every plan (planner/validate.py).

    ``hicache.storage_dir`` and ``hicache.storage_max_size`` configure the file L3 backend
    only: they become ``SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR`` / ``_MAX_SIZE``, which
    SGLang's ``HiCacheFile`` reads (``srt/mem_cache/hicache_storage.py``), and ``flags.server_env``
    sets them only with ``hicache_storage_backend: file``. Without that backend they are
    ignored, and a user who set them likely expected an L3 tier."""
    hc = profile.hicache
    if not hc.enabled or hc.hicache_storage_backend == "file":
        return []
    keys = [k for k in ("storage_dir", "storage_max_size") if getattr(hc, k) is not None]
    if not keys:
        return []
    named = " and ".join(keys)
    verb = "is" if len(keys) == 1 else "are"
    if hc.hicache_storage_backend is None:
        msg = (f"no hicache_storage_backend, so L3 is off and {named} {verb} ignored; "
               "add `hicache_storage_backend: file` to use them as the L3 file store")
    else:
        msg = (f"{named} {verb} ignored: {'it configures' if len(keys) == 1 else 'they configure'} the file "
               f"L3 backend only, and hicache_storage_backend is {hc.hicache_storage_backend}")
    return [(("hicache", keys[0]), msg)]


# --------------------------------------------------------------------------- SGLang's late refusals
# Rules that need the profile alone, for configurations SGLang 0.5.19 accepts while parsing and
# resolving its arguments and refuses later, once the server runs (docs/late-checks.md lists
# every such check). They are not pydantic errors: the input is well formed, SGLang refuses it,
# so loading raises ``Refused`` (exit 3) and ``plan``/``up``/``serve``/``profiles validate`` all
# report it as ``file:line: key: message``. Rules that need the architecture or host facts are
# the planner's (planner/validate.py).


def sglang_late_refusals(profile: Profile) -> list[tuple[tuple[str, ...], str]]:
    """``(key path, message)`` for each configuration SGLang 0.5.19 refuses after startup."""
    out: list[tuple[tuple[str, ...], str]] = []
    hc = profile.hicache
    if hc.enabled and hc.hicache_io_backend == "kernel_ascend":
        # pool_host/mha.py: load_to_device_per_layer takes kernel_ascend only with
        # page_first_direct through Ascend NPU kernels; pool_host/mamba.py: _copy_tensor raises
        # "Unsupported io_backend" for anything but kernel and direct.
        out.append((("hicache", "hicache_io_backend"),
                    "kernel_ascend moves HiCache pages with Ascend NPU kernels: on a CUDA GPU SGLang fails at the "
                    "first host transfer (pool_host/mha.py, pool_host/mamba.py: Unsupported io_backend); use kernel or direct"))
    if hc.enabled and hc.hicache_io_backend == "direct" and hc.hicache_mem_layout == "page_head":
        # pool_host/mha.py: load_to_device_per_layer / backup_from_device_all_layer raise
        # "Unsupported layout" for io_backend direct unless the layout is layer_first or
        # page_first_direct (arg_groups/hicache_hook.py rewrites only page_first + direct).
        out.append((("hicache", "hicache_mem_layout"),
                    "page_head with hicache_io_backend direct fails at the first host transfer "
                    "(pool_host/mha.py: Unsupported layout); use page_first_direct or layer_first with direct, "
                    "or page_head with kernel"))
    return out


def _is_size_field(field) -> bool:
    """A field typed ``Size`` (or ``Size | None``): its validator is ``parse_size``."""
    import typing

    def has(annotation, metadata=()) -> bool:
        if any(getattr(m, "func", None) is parse_size for m in metadata):
            return True
        return any(has(a, getattr(a, "__metadata__", ())) for a in typing.get_args(annotation))

    return has(field.annotation, field.metadata)


def profile_to_data(profile: BaseModel) -> dict:
    """A profile as plain data that ``load_profile`` reads back to the same profile: like
    ``model_dump(mode="json")``, but sizes written with a unit (``12GiB``), since a bare number
    is refused on the way in."""
    from .units import fmt_size_exact

    out: dict = {}
    for name, field in type(profile).model_fields.items():
        value = getattr(profile, name)
        if isinstance(value, BaseModel):
            out[name] = profile_to_data(value)
        elif _is_size_field(field) and isinstance(value, int):
            out[name] = fmt_size_exact(value)
        else:
            out[name] = profile.__pydantic_serializer__.to_python(profile, mode="json", include={name})[name]
    return out


def profile_json_schema() -> dict:
    """The JSON schema of a profile, generated from the models (editors, docs, CI)."""
    return Profile.model_json_schema()
