"""Configuration rules: each an error or a warning naming the profile field it is about.

The rules are one list, ``RULES``: each a small named function over ``Inputs`` with its source,
where SGLang 0.5.19 (or an upstream issue) shows the failure; ``validate`` runs them in order.
Errors make the plan ``unsafe`` (refused before anything starts); warnings are printed with the
plan. The helpers above the list are the rules' shared reading of SGLang (the mamba strategy it
resolves, the attention backends its model runner builds), which the planner's steps use too.
Rules that depend on host memory live in the planner's budget steps, not here; rules that need
the profile alone are checked when it loads (``profile.profile_only_problems``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..sglang.arch import ModelArch, ModelDirFacts
from ..profile import HiCache, Profile, Runtime, key_flag, profile_only_warnings
from ..profile.rules import extra_arg, speculative_algorithm
from ..profile.models import normalize_kv_dtype
from ..sglang.releases import Nvfp4Prefill, Release
from .draft import DraftCount
from .result import Finding

L3_NOT_FOR_HYBRID = {"eic", "simm", "aibrix"}
#: Speculative algorithms that draft with an EAGLE-style worker (``--speculative-algorithm``;
#: SGLang maps NEXTN to EAGLE: ``srt/speculative/spec_info.py: SpeculativeAlgorithm.from_string``).
#: On a hybrid model with the mamba ``extra_buffer`` strategy, sglang#36537 reports token-0 output
#: once KV usage passes about 0.6; ``extra_buffer_lazy`` supports them (sglang#30437).
EAGLE_STYLE = {"EAGLE", "EAGLE3", "NEXTN"}
#: Mooncake's global segment when MOONCAKE_GLOBAL_SEGMENT_SIZE is unset: "4gb", which
#: ``mooncake_store.py: _parse_global_segment_size`` reads as 4 x 1024**3 bytes (``srt/environ.py``).
MOONCAKE_DEFAULT_SEGMENT = 4 * 1024**3
GiB_BYTES = 1024**3


#: ``--mamba-track-interval``'s default in SGLang 0.5.19 and 0.5.23 (srt/server_args.py:
#: ``mamba_track_interval``; each release's flags.json records it).
MAMBA_TRACK_INTERVAL = 256


#: SGLang's attention backends for MLA models only (``--attention-backend`` choices).
MLA_BACKENDS = ("flashmla", "cutlass_mla", "trtllm_mla", "cutedsl_mla", "tokenspeed_mla")


def l3_host_bytes(profile: Profile) -> int:
    """Bytes of host memory an L3 store takes on this box beside the host pools: Mooncake's
    global segment (``hicache.l3.global_segment_size``, else SGLang's 4 GiB), which
    ``mooncake_store.py`` splits over the tp x pp ranks, so the box holds it once in all; 0 for
    the other backends (the file backend's pages are on disk)."""
    hc = profile.hicache
    l3 = hc.l3
    if not hc.enabled or getattr(l3, "kind", None) != "mooncake":
        return 0
    return int(getattr(l3, "global_segment_size", None) or MOONCAKE_DEFAULT_SEGMENT)


HYBRID_LAYOUTS = {"page_first", "page_first_direct"}


def mamba_slots_per_request(strategy: str, disable_radix_cache: bool = False) -> int:
    """Mamba state slots one running request holds, with the overlap scheduler on (SGLang's
    default): ``kv_cache_configurator.py: _calculate_mamba_ratio`` = 3
    (``MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO``) + 2 ping-pong slots for extra_buffer
    (1 for extra_buffer_lazy); no_buffer turns the overlap scheduler off and stays at 3; 1 with
    the radix cache disabled. ``auto`` resolves to extra_buffer for the GDN models SGLang
    routes to the mamba radix cache (``arg_groups/overrides.py: _mamba_radix_cache_resolution``)."""
    if disable_radix_cache:
        return 1
    return {"no_buffer": 3, "extra_buffer_lazy": 4}.get(strategy, 5)


def resolved_mamba_strategy(profile: Profile, arch: ModelArch) -> tuple[str | None, str | None]:
    """The ``--mamba-radix-cache-strategy`` to render and, when the plan chose it, why.

    ``None`` for a dense model or ``auto`` left to SGLang (``arg_groups/overrides.py:
    _mamba_radix_cache_resolution`` picks extra_buffer with the overlap scheduler or pages > 1).
    With an EAGLE-style ``--speculative-algorithm`` on a hybrid model, ``auto`` becomes
    ``extra_buffer_lazy``: SGLang's own pick, extra_buffer, returns token-0 output there
    (sglang#36537). Returns ``(value, reason)``; ``reason`` is ``None`` when the profile set it."""
    strategy = profile.runtime.mamba_radix_cache_strategy
    if not arch.is_hybrid:
        return None, None
    if strategy != "auto":
        return strategy, None
    spec = speculative_algorithm(profile)
    if spec in EAGLE_STYLE and not profile.runtime.disable_radix_cache:
        return "extra_buffer_lazy", (
            f"auto with --speculative-algorithm {spec} on a hybrid model: SGLang's auto picks extra_buffer, "
            "which returns token-0 output once KV usage passes about 0.6 (sglang#36537); extra_buffer_lazy "
            "supports speculative decoding (sglang#30437)")
    return None, None


def _flag_int(extra_args: Sequence[str], flag: str, default: int) -> int:
    """An integer flag of ``runtime.extra_args`` (``default`` when absent or not an integer: the
    flag catalog's check refuses that argv)."""
    value = extra_arg(extra_args, flag)
    try:
        return int(value) if value is not None else default
    except ValueError:
        return default


def attention_tp_size(tp_size: int, extra_args: Sequence[str]) -> int:
    """The attention tensor-parallel width SGLang derives (``srt/runtime_context.py:
    derive_attention_widths``): ``tp_size // attn_dp // attn_cp``, where attn_dp is
    ``--attn-dp-size`` (0.5.23) or, with ``--enable-dp-attention``, ``--dp-size``, else 1, and
    attn_cp is ``--attn-cp-size`` (1 unless given)."""
    attn_dp = _flag_int(extra_args, "--attn-dp-size", 0) or (
        _flag_int(extra_args, "--dp-size", 1) if extra_arg(extra_args, "--enable-dp-attention") == "true" else 1)
    return max(tp_size // max(attn_dp, 1) // max(_flag_int(extra_args, "--attn-cp-size", 1), 1), 1)


def _trtllm_mha_page_problem(release: Release, page_size: int | None, major: int, sm: str, arch: ModelArch,
                             model_dir: ModelDirFacts | None, attn_tp: int) -> tuple[str, str, str] | None:
    """``TRTLLMHAAttnBackend.__init__``'s page-size check (``Release.trtllm_mha_pages``) on the
    page SGLang resolves for trtllm_mha: ``(severity, field, message)`` or None. An error where
    the plan knows the query heads (the model folder's config.json); where it does not, and
    only the heads decide, a warning that says what SGLang checks."""
    rule = release.trtllm_mha_pages
    if rule is None or page_size is None:
        return None
    page = page_size if page_size in rule.snap_pages else rule.snap_to  # overrides.py: _mla_backend_page_constraints
    if page < rule.gen_min_page or major in rule.xqa_majors:
        return None
    heads = model_dir.num_attention_heads if model_dir is not None else None
    kv = max(1, arch.num_key_value_heads // attn_tp)  # srt/configs/model_config.py: get_num_kv_heads
    v_head_dim = (model_dir.v_head_dim if model_dir is not None else None) or arch.head_dim
    site = (f"SGLang {release.version} refuses it when the model runner builds the attention backend, after the "
            "weights load (layers/attention/trtllm_mha_backend.py: TRTLLMHAAttnBackend.__init__, \"requires "
            f"trtllm-gen's dynamic tokens-per-page kernels\"); use runtime.page_size {rule.snap_to} or less")
    pow2 = page & (page - 1) == 0
    if heads is None and pow2 and arch.head_dim == v_head_dim:
        return ("warning", "runtime.page_size",
                f"trtllm_mha (runtime.attention_backend) with page_size {page} on {sm} (no XQA kernels) runs "
                "trtllm-gen's dynamic tokens-per-page kernels, which need more query heads than KV heads per "
                f"attention-TP rank ({kv} KV heads here); the plan does not know the query heads without the model "
                f"folder's config.json (num_attention_heads): if they are fewer than {2 * kv * attn_tp} in all, {site}")
    q = heads // attn_tp if heads is not None else None
    why = [w for w, bad in ((f"{q}/{kv} query heads per KV head (GQA needs more than 1)", q is not None and q // kv <= 1),
                            (f"head_dim {arch.head_dim} and v_head_dim {v_head_dim} differ", arch.head_dim != v_head_dim),
                            (f"page {page} is not a power of 2", not pow2)) if bad]
    if not why:
        return None
    return ("error", "runtime.page_size",
            f"trtllm_mha (runtime.attention_backend) with page_size {page} on {sm} (no XQA kernels) runs trtllm-gen's "
            f"dynamic tokens-per-page kernels, which need GQA, equal QK/V head dims and a power-of-2 page, and "
            f"{'; '.join(why)}: {site}")


def model_runner_backend_problems(release: Release, arch: ModelArch, attention_backend: str | None,
                                  extra_args: Sequence[str], capability: str | None, *,
                                  page_size: int | None = None, tp_size: int = 1,
                                  model_dir: ModelDirFacts | None = None) -> list[tuple[str, str, str]]:
    """What the release's model runner refuses when it builds the attention backend on a card of
    compute capability ``capability`` (``"12.0"``; None: unknown, nothing refused), after the
    weights load (``Release.attention_registry``, ``Release.trtllm_mha_pages``): the first
    refusal SGLang meets as ``(severity, field, message)``, an error, after any warnings for a
    check whose input the plan lacks (trtllm_mha's query heads without the model folder). Only
    the backends the profile names are judged (``attention_backend``, and
    ``--prefill-attention-backend`` / ``--decode-attention-backend`` in ``extra_args``, which
    SGLang's ``attention_backends_of`` prefers for their phase); one left to SGLang is its
    choice, which its pre-flight reports.
    ``page_size``: the plan's page (tokens); ``tp_size``: ``runtime.tp_size``; ``model_dir``:
    the model folder's config.json (its query heads and ``v_head_dim``), None when not read.

    Order as SGLang builds them (``model_runner_components/attention_backend_setup.py:
    _build_resolved_backend``): each phase's factory first, decode before prefill when they
    differ (``attention_registry.py: create_flashattention_v3_backend`` asserts SM 8.x or 9.x
    for fa3; ``create_trtllm_mha_backend`` constructs ``TRTLLMHAAttnBackend``, whose
    ``__init__`` checks the page size off XQA cards), then ``attn_backend_wrapper`` on a hybrid
    GDN model (on Blackwell, prefill and decode must be in the major's set: sm_120 allows
    triton, trtllm_mha and flashinfer)."""
    rule = release.attention_registry
    if rule is None or not capability:
        return []
    try:
        major = int(capability.split(".")[0])
    except ValueError:
        return []
    prefill = extra_arg(extra_args, "--prefill-attention-backend") or attention_backend
    decode = extra_arg(extra_args, "--decode-attention-backend") or attention_backend
    sm = f"sm_{capability.replace('.', '')}"
    warned: list[tuple[str, str, str]] = []  # SGLang goes on building when the heads allow it
    for backend in dict.fromkeys((decode, prefill)):
        if backend == "fa3" and major not in rule.fa3_majors:
            return [*warned, ("error", "runtime.attention_backend",
                     f"fa3 (FlashAttention v3) needs an SM 8.x or 9.x GPU and this one is {sm}: SGLang "
                     f"{release.version} refuses it when the model runner builds the attention backend, after the "
                     "weights load (layers/attention/attention_registry.py: create_flashattention_v3_backend, "
                     "\"FlashAttention v3 Backend requires SM>=80 and SM<=90\"); use triton or flashinfer")]
        if backend == "trtllm_mha":
            found = _trtllm_mha_page_problem(release, page_size, major, sm, arch, model_dir,
                                             attention_tp_size(tp_size, extra_args))
            if found is not None and found[0] == "error":
                return [found]
            warned += [found] if found is not None else []
    allowed = rule.hybrid_gdn_backends.get(major)
    if arch.is_hybrid and allowed is not None:
        bad = [f"{phase}{b}" for phase, b in (("prefill ", prefill), ("decode ", decode))
               if b is not None and b not in allowed]
        if prefill == decode and bad:
            bad = [str(prefill)]
        if bad:
            return [*warned, ("error", "runtime.attention_backend",
                     f"a hybrid GDN model on {sm} takes only the {', '.join(allowed)} attention backends, not "
                     f"{' and '.join(bad)}: SGLang {release.version} refuses it when the model runner builds the "
                     "attention backend, after the weights load (layers/attention/attention_registry.py: "
                     "attn_backend_wrapper, \"Only ... backends are supported on Blackwell GPUs for hybrid GDN "
                     "models\")")]
    return warned


def explicit_prefill_graph_backend(disable_prefill_cuda_graph: bool,
                                   extra_args: Sequence[str]) -> tuple[str, str] | None:
    """The prefill CUDA graph backend the profile sets and the flag that set it, as SGLang
    resolves it (``srt/arg_groups/cuda_graph_hook.py: parse_cuda_graph_config``, highest first):
    ``--cuda-graph-config``'s ``prefill.backend``, ``--cuda-graph-backend-prefill``,
    ``--disable-prefill-cuda-graph`` (``runtime.disable_prefill_cuda_graph``) or
    ``--disable-cuda-graph`` (both ``disabled``). None when none is set: SGLang's default
    (breakable on CUDA) and its compatibility cascade (``apply_cuda_graph_compatibility``, which
    runs only then) decide."""
    import json

    raw = extra_arg(extra_args, "--cuda-graph-config")
    try:
        prefill = json.loads(raw).get("prefill") if raw else None
    except (ValueError, AttributeError):  # not a JSON object: the flag check refuses the argv
        prefill = None
    if isinstance(prefill, dict) and isinstance(prefill.get("backend"), str):
        return str(prefill["backend"]), "--cuda-graph-config prefill.backend"
    backend = extra_arg(extra_args, "--cuda-graph-backend-prefill")
    if backend is not None and backend != "true":
        return backend, "--cuda-graph-backend-prefill"
    if disable_prefill_cuda_graph:
        return "disabled", "runtime.disable_prefill_cuda_graph"
    if extra_arg(extra_args, "--disable-cuda-graph") == "true":
        return "disabled", "--disable-cuda-graph"
    return None


def mixed_chunk_prefill_graph_problem(release: Release, enable_mixed_chunk: bool, attention_backend: str | None,
                                      disable_prefill_cuda_graph: bool, extra_args: Sequence[str]) -> str | None:
    """What the release's prefill CUDA graph runner refuses with ``--enable-mixed-chunk``
    (``Release.mixed_chunk_prefill_graph``): one line, or None. SGLang 0.5.19 asserts the
    resolved prefill graph backend is breakable when it captures the prefill graph, after the
    weights load (0.5.23: breakable or full; its parser takes nothing else but disabled).

    Judged only where the profile sets the backend (``explicit_prefill_graph_backend``) and
    mixed chunk survives argument resolution: not with ``--speculative-algorithm`` (its hook
    clears or refuses mixed chunk, and an EAGLE target on tc_piecewise skips the prefill graph:
    ``cuda_graph_setup.py: capture_prefill_graph``), ``--dllm-algorithm`` (``dllm_hook.py``
    clears it) or the ``dual_chunk_flash_attn`` backend (``attention_hook.py`` clears it)."""
    rule = release.mixed_chunk_prefill_graph
    if rule is None or not enable_mixed_chunk or attention_backend == "dual_chunk_flash_attn":
        return None
    if extra_arg(extra_args, key_flag("runtime.speculative.algorithm")) or extra_arg(extra_args, "--dllm-algorithm"):
        return None
    found = explicit_prefill_graph_backend(disable_prefill_cuda_graph, extra_args)
    if found is None or found[0] == "disabled" or found[0] in rule.backends:
        return None
    backend, flag = found
    return (f"mixed chunk (--enable-mixed-chunk) needs the {' or '.join(rule.backends)} prefill CUDA graph "
            f"backend, and runtime.extra_args sets {backend} ({flag}): SGLang {release.version} stops with an "
            "AssertionError when it captures the prefill CUDA graph, after the weights load "
            "(model_executor/runner/prefill_cuda_graph_runner.py: PrefillCudaGraphRunner.__init__, \"Mixed chunk "
            "prefill requires ...\"); set runtime.enable_mixed_chunk false, or use "
            f"--cuda-graph-backend-prefill {rule.backends[0]} or disabled")


def _nvfp4_backend_problems(rule: Nvfp4Prefill, attention_backend: str | None, extra_args: Sequence[str],
                            capability: str | None) -> list[str]:
    """What the release's NVFP4 backend resolution refuses (``Nvfp4Prefill``), one line each."""
    requested = extra_arg(extra_args, "--prefill-kv-cache-dequant-dtype") or "auto"
    prefill = extra_arg(extra_args, "--prefill-attention-backend")
    decode = extra_arg(extra_args, "--decode-attention-backend")
    explicit = prefill or attention_backend
    dtype_of = {backend: d for d, backend in rule.backend_of_dtype.items()}
    out: list[str] = []
    if requested == "auto":
        if explicit in dtype_of:
            requested = dtype_of[explicit]
        elif explicit is not None:
            return [f"the prefill needs {' or '.join(sorted(dtype_of))} (an FP8 E4M3 workspace or native NVFP4), "
                    f"and the attention backend {explicit} provides neither"]
        else:
            requested = "nvfp4" if capability == rule.native_needs_capability else "fp8_e4m3"
    if requested == "nvfp4" and capability != rule.native_needs_capability:
        out.append(f"native NVFP4 prefill needs compute capability {rule.native_needs_capability} (this GPU is "
                   f"{capability or 'unknown'}); use --prefill-kv-cache-dequant-dtype fp8_e4m3")
    target = rule.backend_of_dtype.get(requested)
    if prefill is not None and target is not None and prefill != target:
        out.append(f"the {requested} prefill dequant dtype needs prefill backend {target}, not {prefill}")
    if decode is not None and decode != rule.decode_backend:
        out.append(f"the decode needs --decode-attention-backend {rule.decode_backend}, not {decode}")
    return out


# --------------------------------------------------------------------------- the rules
# Each rule reads ``Inputs`` and returns its findings, in order; ``RULES`` lists them in the
# order their findings are reported. A rule's ``source`` is where SGLang (or the overlay, or
# an upstream issue) shows the failure it guards against.


@dataclass(frozen=True)
class Inputs:
    """What the configuration rules read: the profile, the model's architecture, the runtime's
    capabilities, the plan's page (tokens) and device mamba slots per rank, the model folder's
    config.json facts (None: not read), the SGLang release planned (None: no release facts) and
    what the plan counts of a speculative draft (``draft.draft_count``; None: nothing)."""

    profile: Profile
    arch: ModelArch
    capabilities: frozenset[str]
    page_size: int
    mamba_slots: int
    model_dir: ModelDirFacts | None = None
    release: Release | None = None
    draft: DraftCount | None = None

    @property
    def rt(self) -> Runtime:
        return self.profile.runtime

    @property
    def hc(self) -> HiCache:
        return self.profile.hicache

    @property
    def dtype(self) -> str:
        """``runtime.kv_cache.dtype`` as SGLang names it (``normalize_kv_dtype``)."""
        return normalize_kv_dtype(self.rt.kv_cache.dtype)

    @property
    def strategy(self) -> str:
        """The mamba radix cache strategy SGLang runs: the plan's pick (``resolved_mamba_strategy``)
        or the profile's."""
        return resolved_mamba_strategy(self.profile, self.arch)[0] or self.rt.mamba_radix_cache_strategy

    @property
    def prefill_backend(self) -> str | None:
        """The prefill attention backend the profile names (``--prefill-attention-backend`` in
        ``runtime.extra_args`` first, as SGLang prefers it), None when left to SGLang."""
        return extra_arg(self.rt.extra_args, "--prefill-attention-backend") or self.rt.attention_backend


@dataclass(frozen=True)
class Rule:
    """One configuration rule: ``name`` (kebab-case), ``source`` (the SGLang file and function,
    or the upstream issue, that shows the failure), ``check`` (the findings for ``Inputs``)."""

    name: str
    source: str
    check: Callable[[Inputs], list[Finding]]


def _error(field: str, message: str) -> Finding:
    return Finding(severity="error", field=field, message=message)


def _warn(field: str, message: str) -> Finding:
    return Finding(severity="warning", field=field, message=message)


def _kv_heads_split(i: Inputs) -> list[Finding]:
    """The KV heads split evenly over the TP ranks, or are fewer than them (then replicated).
    Parallelism beyond this (tp_size > gpu_count) is ``profile.profile_only_problems``'."""
    kvh, tp = i.arch.num_key_value_heads, i.rt.tp_size
    if kvh >= tp and kvh % tp != 0:
        return [_error("model.architecture.num_key_value_heads",
                       f"{kvh} KV heads are neither divisible by tp_size {tp} nor fewer than it "
                       "(srt/configs/model_config.py: get_num_kv_heads)")]
    return []


def _gdn_state_split(i: Inputs) -> list[Finding]:
    """The GDN state per rank: ``Mamba2StateShape.create`` divides the value heads (temporal
    state) and the conv dim (value dim x heads + 2 x key groups, the groups extended to a
    multiple of tp: ``extra_groups_for_head_shards``) by tp_size, and ``divide`` asserts each is a
    multiple ("1 is not divisible by 2"): SGLang stops when the configurator builds the mamba
    cache params."""
    arch, tp = i.arch, i.rt.tp_size
    heads, groups, k_dim, v_dim = (arch.linear_num_value_heads, arch.linear_num_key_heads,
                                   arch.linear_key_head_dim, arch.linear_value_head_dim)
    if not (arch.linear_layer_ids() and heads and groups and k_dim and v_dim):
        return []
    groups += -groups % tp
    conv_dim = v_dim * heads + 2 * groups * k_dim
    if heads % tp or conv_dim % tp:
        what = f"{heads} GDN value heads" if heads % tp else f"the GDN conv dim {conv_dim}"
        return [_error("model.architecture.linear_num_value_heads",
                       f"{what} not divisible by tp_size {tp}: SGLang's mamba state shape divides it across the "
                       "ranks (srt/configs/mamba_utils.py: Mamba2StateShape.create; srt/distributed/utils.py: divide)")]
    return []


def _context_length(i: Inputs) -> list[Finding]:
    """A ``--context-length`` above what the model folder's config.json allows: SGLang raises
    ValueError unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN is set (then it warns)."""
    rt, md = i.rt, i.model_dir
    if not (rt.context_length and md and md.context_length and rt.context_length > md.context_length):
        return []
    if not rt.allow_longer_context_length:
        return [_error("runtime.context_length",
                       f"{rt.context_length} tokens is more than the {md.context_length} the model folder's "
                       f"config.json allows ({md.context_length_key}): SGLang stops at startup "
                       "(srt/configs/model_config.py: ModelConfig._derive_context_length); lower it, or set "
                       "runtime.allow_longer_context_length: true (SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1; "
                       "SGLang warns of incorrect outputs or CUDA errors past the trained length)")]
    return [_warn("runtime.context_length",
                  f"{rt.context_length} tokens is more than the {md.context_length} the model folder's "
                  f"config.json allows ({md.context_length_key}); allowed by "
                  "runtime.allow_longer_context_length (SGLang warns of incorrect outputs or CUDA errors)")]


def _int2_kv(i: Inputs) -> list[Finding]:
    """INT2 KV needs its overlay, and its page and windows follow its packing: 4 codes per
    byte, a page of 4 x itemsize(hp_dtype) tokens."""
    if i.dtype != "int2":
        return []
    out: list[Finding] = []
    if "int2-kv" not in i.capabilities:
        out.append(_error("runtime.kv_cache.dtype", "int2 needs the int2-kv capability (a user overlay: "
                          "the fork's OSCAR INT2 patch); stock SGLang 0.5.19 has no int2 KV pool"))
    i2, head_dim = i.rt.kv_cache.int2, i.arch.head_dim
    n_q = 4 * (2 if i2.hp_dtype in ("bfloat16", "float16") else 4)
    if head_dim % 4:
        out.append(_error("model.architecture.head_dim",
                          f"INT2 packs 4 codes per byte: head_dim {head_dim} must be a multiple of 4"))
    if head_dim % i2.group_size:
        out.append(_error("runtime.kv_cache.int2.group_size",
                          f"head_dim {head_dim} is not a multiple of group_size {i2.group_size}"))
    if i.page_size != n_q:
        out.append(_error("runtime.page_size",
                          f"the INT2 page is 4 x itemsize({i2.hp_dtype}) = {n_q} tokens, not {i.page_size}"))
    for name in ("prefix_tokens", "recent_tokens"):
        if getattr(i2, name) % n_q:
            out.append(_error(f"runtime.kv_cache.int2.{name}", f"must be a multiple of the INT2 page ({n_q})"))
    return out


def _quant_method_known(i: Inputs) -> list[Finding]:
    """The model folder's quantization method is one the release knows (its list:
    ``catalog/releases/X.Y.Z/facts.yaml: quantization_methods``)."""
    md, release = i.model_dir, i.release
    qm = md.quant_method if md is not None else None
    methods = release.quantization_methods if release is not None else None
    if qm and md is not None and release is not None and methods is not None and qm.lower() not in methods.known:
        return [_error("model.host_dir",
                       f"{md.path}/config.json: quantization_config.quant_method {qm!r} is no quantization method "
                       f"SGLang {release.version} knows (its {len(methods.known)}: {', '.join(methods.known)}; "
                       "layers/quantization/__init__.py): its model config refuses it at startup "
                       "(configs/model_config.py: _verify_quantization, 'Unknown quantization method'); use a "
                       "checkpoint quantized with one of them")]
    return []


def _quantization_loadable(i: Inputs) -> list[Finding]:
    """A ``--quantization`` the release's parser takes but its model config has no method for."""
    q, release = i.profile.model.quantization, i.release
    if q and release is not None and release.quantization_not_loadable and q in release.quantization_not_loadable.methods:
        return [_error("model.quantization",
                       f"SGLang {release.version} parses --quantization {q} but has no such quantization method: its "
                       "model config refuses it at startup (configs/model_config.py: _verify_quantization, Unknown "
                       "quantization method)")]
    return []


def _nvfp4_online_blackwell(i: Inputs) -> list[Finding]:
    """``_moe_runner_backend_quant_constraints`` raises ValueError "--quantization nvfp4_online
    is supported only on NVIDIA Blackwell SM100/SM103 GPUs"."""
    cc = i.profile.hardware.compute_capability
    if i.profile.model.quantization == "nvfp4_online" and cc not in ("10.0", "10.3"):
        return [_error("model.quantization",
                       f"nvfp4_online needs an sm_100 or sm_103 GPU (this one is "
                       f"{cc or 'of unknown compute capability'}): SGLang refuses it at "
                       "startup (arg_groups/overrides.py: _moe_runner_backend_quant_constraints)")]
    return []


def _escha_w2(i: Inputs) -> list[Finding]:
    """The escha_w2 quantization exists only with the w2-weights overlay."""
    if i.profile.model.quantization == "escha_w2" and "w2-weights" not in i.capabilities:
        return [_error("model.quantization", "escha_w2 needs the w2-weights capability (a user overlay)")]
    return []


def _no_buffer_page(i: Inputs) -> list[Finding]:
    """``validate_mamba_no_buffer`` asserts "no_buffer only supports page_size=1." (auto picks
    extra_buffer for page > 1)."""
    rt = i.rt
    if i.arch.is_hybrid and i.page_size > 1 and rt.mamba_radix_cache_strategy == "no_buffer" \
            and not rt.disable_radix_cache:
        return [_error("runtime.mamba_radix_cache_strategy",
                       f"no_buffer needs page_size 1 (page_size is {i.page_size}): SGLang refuses it at startup "
                       "(arg_groups/mamba_hook.py: validate_mamba_no_buffer); use extra_buffer or auto")]
    return []


def _no_buffer_overlap(i: Inputs) -> list[Finding]:
    """``validate_mamba_no_buffer`` asserts "no_buffer do not support overlap schedule" (overlap
    is on unless ``--disable-overlap-schedule``)."""
    rt = i.rt
    if i.arch.is_hybrid and rt.mamba_radix_cache_strategy == "no_buffer" and not rt.disable_radix_cache \
            and extra_arg(rt.extra_args, "--disable-overlap-schedule") is None:
        return [_error("runtime.mamba_radix_cache_strategy",
                       "no_buffer does not support the overlap scheduler: SGLang refuses it at startup "
                       "(arg_groups/mamba_hook.py: validate_mamba_no_buffer); use extra_buffer or auto, or add "
                       "--disable-overlap-schedule to runtime.extra_args")]
    return []


def _extra_buffer_interval(i: Inputs) -> list[Finding]:
    """``validate_mamba_extra_buffer`` asserts ``mamba_track_interval % page_size == 0`` (auto is
    extra_buffer for pages > 1)."""
    rt, page_size = i.rt, i.page_size
    given = extra_arg(rt.extra_args, "--mamba-track-interval")
    interval = int(given) if given and given.isdigit() else MAMBA_TRACK_INTERVAL  # not an int: the flag check says so
    if i.arch.is_hybrid and page_size > 1 and i.strategy != "no_buffer" and not rt.disable_radix_cache \
            and interval and interval % page_size:
        return [_error("runtime.page_size",
                       f"page_size {page_size} does not divide --mamba-track-interval {interval}: the mamba "
                       "extra_buffer strategy tracks states every interval tokens, on page boundaries; SGLang refuses "
                       "it at startup (arg_groups/mamba_hook.py: validate_mamba_extra_buffer, an AssertionError "
                       "without a message); use a page_size that divides it (1, 16, 64)")]
    return []


def _aiter_not_cuda(i: Inputs) -> list[Finding]:
    """AMD's ROCm kernels (``srt/layers/attention/aiter_backend.py``); on these boxes' NVIDIA GPUs
    SGLang also scales mem_fraction_static by 0.85 for it past 8,192 tokens of context
    (``handle_attention_backend_compatibility``), a budget this plan does not size."""
    if i.rt.attention_backend == "aiter":
        return [_error("runtime.attention_backend",
                       "aiter is the attention backend of AMD's ROCm kernels (aiter_backend.py), not a CUDA GPU's, "
                       "and SGLang cuts mem_fraction_static to 0.85 of it past 8,192 tokens of context "
                       "(attention_hook.py: handle_attention_backend_compatibility): use triton, flashinfer or fa3")]
    return []


def _mla_backend(i: Inputs) -> list[Finding]:
    """Backends for multi-head latent attention layers (DeepSeek's MLA:
    ``srt/layers/attention/flashmla_backend.py``, ``cutlass_mla_backend.py``,
    ``trtllm_mla_backend.py``, ...); the models planned here have none. SGLang also refuses them
    off Blackwell while resolving its arguments (``arg_groups/overrides.py:
    _mla_kv_cache_dtype_checks``, ``_cutedsl_prefill_backend_fill``)."""
    rt = i.rt
    mla = [b for b in (rt.attention_backend, extra_arg(rt.extra_args, "--prefill-attention-backend"),
                       extra_arg(rt.extra_args, "--decode-attention-backend")) if b in MLA_BACKENDS]
    if mla:
        return [_error("runtime.attention_backend",
                       f"{mla[0]} is an attention backend for MLA (multi-head latent attention) models, and "
                       f"{i.arch.model_type} has no MLA layers: use triton, flashinfer or fa3")]
    return []


def _trtllm_mha_prefill_sm(i: Inputs) -> list[Finding]:
    """``handle_attention_backend_compatibility`` raises "TRTLLM MHA backend for prefill requires
    Hopper (SM90), Blackwell (SM100), or SM120 GPUs"."""
    cc = i.profile.hardware.compute_capability
    if i.prefill_backend == "trtllm_mha" and cc and cc.split(".")[0] not in ("9", "10", "12"):
        return [_error("runtime.attention_backend",
                       f"trtllm_mha prefill needs an sm_90, sm_100 or sm_120 GPU (this one is "
                       f"sm_{cc.replace('.', '')}): SGLang refuses it at startup (arg_groups/attention_hook.py: "
                       "handle_attention_backend_compatibility)")]
    return []


def _trtllm_mha_prefill_fp8(i: Inputs) -> list[Finding]:
    """``handle_attention_backend_compatibility`` raises "TRTLLM FMHAv2 prefill on SM120 does not
    support fp8_e4m3 KV cache"."""
    if i.prefill_backend == "trtllm_mha" and i.profile.hardware.compute_capability == "12.0" \
            and i.dtype == "fp8_e4m3":
        return [_error("runtime.attention_backend",
                       "trtllm_mha prefill on sm_120 does not support an fp8_e4m3 KV cache: SGLang refuses it at "
                       "startup (arg_groups/attention_hook.py: handle_attention_backend_compatibility); use triton "
                       "or flashinfer")]
    return []


def _model_runner_backends(i: Inputs) -> list[Finding]:
    """What the release's model runner refuses when it builds the attention backend
    (``model_runner_backend_problems``)."""
    release, rt = i.release, i.rt
    if release is None or release.attention_registry is None:
        return []
    return [(_error if severity == "error" else _warn)(field, message)
            for severity, field, message in model_runner_backend_problems(
                release, i.arch, rt.attention_backend, rt.extra_args, i.profile.hardware.compute_capability,
                page_size=i.page_size, tp_size=rt.tp_size, model_dir=i.model_dir)]


def _flags_not_planned(i: Inputs) -> list[Finding]:
    """A flag in ``extra_args`` that reaches a pool the release builds and the plan does not size
    (``Release.flags_not_planned``, each with its pool class and SGLang source)."""
    if i.release is None:
        return []
    return [_error("runtime.extra_args", f"{rule.flag} reaches {rule.pool} in SGLang {i.release.version}: "
                   f"{rule.why} ({rule.source}); remove it")
            for rule in i.release.flags_not_planned if extra_arg(i.rt.extra_args, rule.flag) is not None]


def _mixed_chunk_prefill_graph(i: Inputs) -> list[Finding]:
    """What the release's prefill CUDA graph runner refuses with ``--enable-mixed-chunk``
    (``mixed_chunk_prefill_graph_problem``)."""
    if i.release is None:
        return []
    rt = i.rt
    mixed = mixed_chunk_prefill_graph_problem(i.release, rt.enable_mixed_chunk, rt.attention_backend,
                                              rt.disable_prefill_cuda_graph, rt.extra_args)
    return [_error("runtime.enable_mixed_chunk", mixed)] if mixed is not None else []


def _nvfp4_prefill(i: Inputs) -> list[Finding]:
    """What the release's NVFP4 prefill backend resolution refuses (``_nvfp4_backend_problems``)."""
    release = i.release
    if i.dtype != "nvfp4" or release is None or release.nvfp4_prefill is None:
        return []
    return [_error("runtime.kv_cache.dtype", f"nvfp4 on SGLang {release.version}: {message}: SGLang refuses it at "
                   "startup (arg_groups/kv_cache_hook.py: handle_nvfp4_prefill_kv_dequant_dtype)")
            for message in _nvfp4_backend_problems(release.nvfp4_prefill, i.rt.attention_backend, i.rt.extra_args,
                                                   i.profile.hardware.compute_capability)]


def _hybrid_mixed_chunk(i: Inputs) -> list[Finding]:
    """Mixed chunked prefill corrupts mamba checkpoints without the fix (sglang#39342, fixed by
    sglang#39526: the mamba-mixed-chunk-fix overlay)."""
    if i.arch.is_hybrid and i.rt.enable_mixed_chunk and "mamba-mixed-chunk-fix" not in i.capabilities:
        return [_error("runtime.enable_mixed_chunk",
                       "mixed chunk corrupts mamba checkpoints on hybrid models without sglang#39526 "
                       "(sglang#39342): set false, or add the mamba-mixed-chunk-fix overlay to runtime.needs")]
    return []


def _hybrid_mamba_slots(i: Inputs) -> list[Finding]:
    """``_handle_max_mamba_cache`` sizes the slots from the mamba state of one request
    (``mamba_utils.py: mamba_cache_per_req``, x the linear-attention layers) and asserts it is
    above 0: with no such layer it is 0, and SGLang stops (an explicit ``--max-mamba-cache-size``
    takes the other branch, which does not divide); it raises "Not enough GPU memory for hybrid
    (mamba/linear-attention) state cache" when it computes no slot."""
    arch, rt = i.arch, i.rt
    if not arch.is_hybrid:
        return []
    if not arch.linear_layer_ids() and rt.max_mamba_cache_size is None:
        return [_error("model.architecture.full_attention_interval",
                       f"{arch.full_attention_interval} makes every one of the {arch.num_hidden_layers} layers full "
                       "attention: a hybrid model with no linear-attention layer has no mamba state to size its "
                       "slots by, and SGLang stops at startup (kv_cache_configurator.py: _handle_max_mamba_cache "
                       "asserts stage_per_req > 0); set runtime.max_mamba_cache_size, or a full_attention_interval "
                       "above 1")]
    if not i.mamba_slots:
        return [_error("runtime.max_mamba_cache_size",
                       "no mamba state slot fits the static budget after the weights: SGLang stops at startup "
                       "(kv_cache_configurator.py: _handle_max_mamba_cache); set runtime.max_mamba_cache_size "
                       "and runtime.max_total_tokens, or raise runtime.mem_fraction_static")]
    return []


def _hybrid_slots_per_request(i: Inputs) -> list[Finding]:
    """``resolve_max_num_reqs`` raises RuntimeError("Hybrid (mamba/linear-attention) state cache
    is too small to serve any requests") when the slots hold no request, after the weights have
    loaded, and caps the running requests to what they hold."""
    rt, mamba_slots = i.rt, i.mamba_slots
    if not (i.arch.is_hybrid and mamba_slots):
        return []
    strategy = i.strategy
    per_req = mamba_slots_per_request(strategy, rt.disable_radix_cache)
    cap = mamba_slots // per_req
    if cap == 0:
        return [_error("runtime.max_mamba_cache_size",
                       f"{mamba_slots} mamba slots are fewer than one request needs ({per_req} with "
                       f"mamba_radix_cache_strategy {strategy}): SGLang stops at startup "
                       "(kv_cache_configurator.py: resolve_max_num_reqs); use at least "
                       f"{per_req * max(rt.max_running_requests or 1, 1)}")]
    if rt.max_running_requests and rt.max_running_requests > cap:
        return [_warn("runtime.max_running_requests",
                      f"{rt.max_running_requests} requests but {mamba_slots} mamba slots at {per_req} "
                      f"per request: SGLang caps it to {cap} (kv_cache_configurator.py: resolve_max_num_reqs)")]
    return []


def _hybrid_max_total_tokens(i: Inputs) -> list[Finding]:
    """``resolve_max_num_reqs`` caps the running requests at token_capacity // 2, then, for a
    hybrid (mamba-ish) model only, raises RuntimeError ("Hybrid (mamba/linear-attention) state
    cache is too small to serve any requests") when that leaves none (after the weights have
    loaded); a dense model is not refused there."""
    rt = i.rt
    if i.arch.is_hybrid and rt.max_total_tokens is not None and rt.max_total_tokens // 2 == 0:
        return [_error("runtime.max_total_tokens",
                       f"{rt.max_total_tokens} token leaves no request: SGLang caps the running requests at "
                       "max_total_tokens // 2 = 0 and stops at startup (kv_cache_configurator.py: "
                       "resolve_max_num_reqs); use at least 2")]
    return []


def _min_total_tokens(i: Inputs) -> list[Finding]:
    """``runtime.min_total_tokens`` above ``runtime.max_total_tokens``: no pool SGLang sizes can
    have both (it never grows the pool past ``--max-total-tokens``: ``_apply_token_constraints``)."""
    rt = i.rt
    if rt.min_total_tokens is not None and rt.max_total_tokens is not None and rt.min_total_tokens > rt.max_total_tokens:
        return [_error("runtime.min_total_tokens",
                       f"{rt.min_total_tokens:,} is above runtime.max_total_tokens {rt.max_total_tokens:,}: SGLang "
                       "never sizes the pool past --max-total-tokens (kv_cache_configurator.py: "
                       "_apply_token_constraints)")]
    return []


def _int2_mixed_windows(i: Inputs) -> list[Finding]:
    """The fork's mixed HP+INT2 KV window (``runtime.kv_cache.int2.mixed_windows``): its report
    says the window is carried but never constructed on a hybrid GDN model, so turning it on there
    asks for an arena the runtime does not build (refused); with speculative decoding OSCAR-derived
    SGLang does not build it either (``model_executor/pool_configurator.py: _compute_cell_size``
    requires ``speculative_algorithm is None``), so it is not counted, and the plan says so."""
    rt = i.rt
    if rt.kv_cache.dtype != "int2" or not rt.kv_cache.int2.mixed_windows:
        return []
    if i.arch.is_hybrid:
        return [_error("runtime.kv_cache.int2.mixed_windows",
                       "true on a hybrid (GDN) model: the fork's mixed HP+INT2 KV window is carried but never "
                       "constructed on one, so no such window would exist; set it to false")]
    if rt.speculative is not None:
        return [_warn("runtime.kv_cache.int2.mixed_windows",
                      "true with speculative decoding: the mixed window is not built then (pool_configurator.py: "
                      "_compute_cell_size needs speculative_algorithm None); the plan counts no window arena")]
    return []


def _eagle_extra_buffer(i: Inputs) -> list[Finding]:
    """An EAGLE-style ``--speculative-algorithm`` with the mamba extra_buffer strategy on a
    hybrid model returns token-0 output (sglang#36537); extra_buffer_lazy supports it
    (sglang#30437)."""
    spec = speculative_algorithm(i.profile)
    if spec and i.arch.is_hybrid and spec in EAGLE_STYLE and i.rt.mamba_radix_cache_strategy == "extra_buffer":
        return [_error("runtime.mamba_radix_cache_strategy",
                       f"extra_buffer with --speculative-algorithm {spec} on a hybrid model returns token-0 output "
                       "once KV usage passes about 0.6 (sglang#36537): set mamba_radix_cache_strategy: "
                       "extra_buffer_lazy (sglang#30437), or auto, which this plan resolves to it")]
    return []


#: The attention backends that implement a top-k > 1 draft tree on pages of more than one token
#: (``arg_groups/speculative_hook.py: _handle_eagle_family``, ``_PAGE_TREE_SPEC_BACKENDS``; the
#: same in 0.5.19, 0.5.21 and 0.5.23).
PAGE_TREE_SPEC_BACKENDS = ("flashinfer", "fa3", "triton")


#: ``--speculative-ngram-max-bfs-breadth``'s default (``server_args.py``): NGRAM's draft tree
#: breadth, which ``_handle_ngram`` makes its ``speculative_eagle_topk``.
NGRAM_BFS_BREADTH = 10


def _ngram_fa4_pages(i: Inputs) -> list[Finding]:
    """NGRAM with ``fa4`` (the profile's ``runtime.attention_backend``) on an sm100 card: SGLang's
    argument resolution first forces fa4's page to 128 tokens for a non-MLA model (its speculative
    top-k is still unset: ``arg_groups/overrides.py: _fa4_page_constraint``), then the NGRAM hook
    sets that top-k to the tree's breadth (``speculative_ngram_max_bfs_breadth``, 10 by default)
    and refuses a top-k above 1 on pages above 1 token with any backend but flashinfer
    (``arg_groups/speculative_hook.py: _handle_ngram``; found by the differential fuzz on 0.5.21,
    the code reads the same in 0.5.19 and 0.5.23)."""
    if i.rt.speculative is None or speculative_algorithm(i.profile) != "NGRAM" or i.rt.attention_backend != "fa4":
        return []
    cc = i.profile.hardware.compute_capability or ""
    if cc.split(".")[0] != "10":  # the models this plan sizes have no MLA attention (``_mla_backend``)
        return []
    breadth = _flag_int(i.rt.extra_args or [], "--speculative-ngram-max-bfs-breadth", NGRAM_BFS_BREADTH)
    if breadth <= 1:
        return []
    return [_error("runtime.attention_backend",
                   f"fa4 with NGRAM speculative decoding on sm_{cc.replace('.', '')}: SGLang sets fa4's page to 128 "
                   f"tokens, then refuses NGRAM's draft tree (top-k = speculative_ngram_max_bfs_breadth {breadth}) on "
                   "pages above 1 token with any backend but flashinfer, and stops at start (overrides.py: "
                   "_fa4_page_constraint; speculative_hook.py: _handle_ngram); use flashinfer, or "
                   "--speculative-ngram-max-bfs-breadth 1 in runtime.extra_args")]


def _eagle_topk_page_backend(i: Inputs) -> list[Finding]:
    """``runtime.speculative.eagle_topk`` above 1 with a page above 1 token and an attention
    backend the profile names that cannot draft a tree on pages: SGLang raises at argument
    resolution. An unset backend is SGLang's pick, not judged here."""
    sp, backend = i.rt.speculative, i.rt.attention_backend
    # the EAGLE family and STANDALONE run _handle_eagle_family (speculative/spec_info.py: handle_server_args)
    if sp is None or speculative_algorithm(i.profile) not in EAGLE_STYLE | {"STANDALONE"} or backend is None:
        return []
    if (sp.eagle_topk or 1) > 1 and i.page_size > 1 and backend not in PAGE_TREE_SPEC_BACKENDS:
        return [_error("runtime.attention_backend",
                       f"{backend} with runtime.speculative.eagle_topk {sp.eagle_topk} on pages of {i.page_size} "
                       f"tokens: SGLang drafts a top-k tree on pages only with {', '.join(PAGE_TREE_SPEC_BACKENDS)} "
                       "and stops at start (speculative_hook.py: _handle_eagle_family); use one of them, eagle_topk 1 "
                       "or runtime.page_size 1")]
    return []


def _eagle_topk_trtllm_mha(i: Inputs) -> list[Finding]:
    """``runtime.speculative.eagle_topk`` above 1 with ``trtllm_mha`` the profile's attention
    backend, on any page size: SGLang raises at argument resolution ("trtllm_mha backend only
    supports topk = 1 for speculative decoding."; ``arg_groups/speculative_hook.py:
    _handle_eagle_family``, the same in 0.5.19, 0.5.21 and 0.5.23; found by the differential
    fuzz's speculative draw). An unset backend is SGLang's pick, not judged here."""
    sp = i.rt.speculative
    if sp is None or speculative_algorithm(i.profile) not in EAGLE_STYLE | {"STANDALONE"}:
        return []
    if i.rt.attention_backend != "trtllm_mha" or (sp.eagle_topk or 1) <= 1:
        return []
    return [_error("runtime.attention_backend",
                   f"trtllm_mha with runtime.speculative.eagle_topk {sp.eagle_topk}: SGLang's trtllm_mha drafts only "
                   "top-k 1 and stops at start (speculative_hook.py: _handle_eagle_family); use eagle_topk 1 or "
                   f"another backend ({', '.join(PAGE_TREE_SPEC_BACKENDS)} draft a tree)")]


def _draft_not_counted(i: Inputs) -> list[Finding]:
    """Each part of a speculative draft the plan does not count (``DraftCount.not_counted``)."""
    if not speculative_algorithm(i.profile):
        return []
    field = "model.draft" if i.profile.model.draft is not None else "runtime.speculative.algorithm"
    return [_warn(field, line) for line in (i.draft or DraftCount()).not_counted]


def _torch_compile_hybrid(i: Inputs) -> list[Finding]:
    """``--enable-torch-compile`` with decode CUDA graphs on a hybrid GDN model was measured
    about 6x slower (sglang#35777)."""
    args = i.rt.extra_args
    if i.arch.is_hybrid and extra_arg(args, "--enable-torch-compile") == "true" \
            and not extra_arg(args, "--disable-cuda-graph"):
        return [_warn("runtime.extra_args",
                      "--enable-torch-compile with decode CUDA graphs on a hybrid GDN model was measured about 6x "
                      "slower (sglang#35777): drop --enable-torch-compile unless a benchmark on this box says "
                      "otherwise")]
    return []


def _hicache_radix(i: Inputs) -> list[Finding]:
    """HiCache needs the radix cache: ``kv_cache_hook.py`` raises ValueError for
    ``--disable-radix-cache``; ``handle_attention_backend_compatibility`` turns the radix cache
    off for dual_chunk_flash_attn and ``handle_cache_compatibility`` then refuses HiCache."""
    if not i.hc.enabled:
        return []
    out: list[Finding] = []
    if i.rt.disable_radix_cache:
        out.append(_error("runtime.disable_radix_cache",
                          "HiCache needs the radix cache (kv_cache_hook.py raises ValueError)"))
    if i.rt.attention_backend == "dual_chunk_flash_attn":
        out.append(_error("runtime.attention_backend",
                          "dual_chunk_flash_attn turns the radix cache off, which HiCache needs: SGLang refuses it "
                          "at startup (arg_groups/kv_cache_hook.py: handle_cache_compatibility)"))
    return out


def _hicache_int8_mamba(i: Inputs) -> list[Finding]:
    """``mamba_hook.py`` raises ValueError for ``--enable-int8-mamba-checkpoint`` with HiCache."""
    if i.hc.enabled and i.rt.enable_int8_mamba_checkpoint:
        return [_error("runtime.enable_int8_mamba_checkpoint",
                       "not allowed with HiCache (mamba_hook.py raises ValueError)")]
    return []


def _hicache_layout(i: Inputs) -> list[Finding]:
    """The host pools' layouts: ``MambaPoolHost`` takes only the page-first layouts
    (``HYBRID_LAYOUTS``) on hybrid models; the MHA host pool refuses page_first_kv_split
    (ValueError); ``buffer_only`` supports only FULL/SWA trees (``unified_radix_cache.py``)."""
    hc, arch = i.hc, i.arch
    if not hc.enabled:
        return []
    out: list[Finding] = []
    if arch.is_hybrid and hc.hicache_mem_layout not in HYBRID_LAYOUTS:
        out.append(_error("hicache.hicache_mem_layout",
                          f"{hc.hicache_mem_layout} is rejected by MambaPoolHost on hybrid models; use page_first"))
    if not arch.is_hybrid and hc.hicache_mem_layout == "page_first_kv_split":
        out.append(_error("hicache.hicache_mem_layout",
                          "page_first_kv_split is refused by the MHA host pool (ValueError)"))
    if arch.is_hybrid and hc.hicache_host_memory_mode == "buffer_only":
        out.append(_error("hicache.hicache_host_memory_mode",
                          "buffer_only supports only FULL/SWA trees; hybrid models need cache (unified_radix_cache.py)"))
    return out


def _l3_hybrid(i: Inputs) -> list[Finding]:
    """L3 backends on a hybrid model: ``L3_NOT_FOR_HYBRID`` do not implement ``batch_*_v2`` and
    raise NotImplementedError; the file backend has illegal-memory-access reports there on stock
    0.5.19 (sglang#16771, #30055)."""
    sb = i.hc.hicache_storage_backend
    if not (i.hc.enabled and sb and i.arch.is_hybrid):
        return []
    if sb in L3_NOT_FOR_HYBRID:
        return [_error("hicache.l3.kind",
                       f"{sb} does not implement batch_*_v2 and raises NotImplementedError on hybrid models")]
    if sb == "file":
        return [_warn("hicache.l3.kind",
                      "file L3 with a hybrid GDN model has illegal-memory-access reports on stock 0.5.19 "
                      "(sglang#16771, #30055): retry without L3 to isolate a crash")]
    return []


def _l3_file_cap(i: Inputs) -> list[Finding]:
    """The file L3 store without ``max_size`` is not evicted (``LRUFileEvictor`` runs only with
    SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE): it grows until the disk is full."""
    hc = i.hc
    if hc.enabled and hc.hicache_storage_backend == "file" and hc.storage_max_size is None:
        return [_warn("hicache.l3.max_size", "no cap on the L3 file store: it grows until the disk is full")]
    return []


def _mooncake_store(i: Inputs) -> list[Finding]:
    """Mooncake needs its master: ``MooncakeStoreConfig.load_from_env`` raises ValueError when
    neither MOONCAKE_MASTER nor MOONCAKE_CLIENT is set; its global segment takes host memory
    beside the pools (``l3_host_bytes``), which the pinned budget subtracts."""
    hc = i.hc
    if not (hc.enabled and hc.hicache_storage_backend == "mooncake"):
        return []
    out: list[Finding] = []
    if not getattr(hc.l3, "master", None):
        out.append(_error("hicache.l3.master",
                          "the Mooncake backend needs its master's HOST:PORT: SGLang stops at start without "
                          "MOONCAKE_MASTER (mooncake_store.py: MooncakeStoreConfig.load_from_env); set "
                          "hicache.l3: {kind: mooncake, master: HOST:PORT}"))
    out.append(_warn("hicache.l3.global_segment_size",
                     f"the Mooncake store takes {l3_host_bytes(i.profile) / GiB_BYTES:.2f} GiB of host memory on "
                     f"this box beside the pools (global_segment_size, split over the {i.rt.tp_size} ranks: "
                     "mooncake_store.py); the pinned budget subtracts it"))
    return out


def _size_over_ratio(i: Inputs) -> list[Finding]:
    """``--hicache-size`` above 0 wins over ``--hicache-ratio`` (``pool_host/base.py``: the size,
    when given, sizes the host pool)."""
    hc = i.hc
    if hc.enabled and hc.hicache_size and hc.hicache_ratio != "auto":
        return [_warn("hicache.hicache_ratio", "hicache_size > 0 overrides hicache_ratio (SGLang ignores the ratio)")]
    return []


def _inert_keys(i: Inputs) -> list[Finding]:
    """Keys that load but do nothing (``profiles validate`` prints the same, with file:line)."""
    return [_warn(".".join(loc), message) for loc, message in profile_only_warnings(i.profile)]


#: Every configuration rule, in the order their findings are reported.
RULES: tuple[Rule, ...] = (
    Rule("kv-heads-split-over-tp", "srt/configs/model_config.py: get_num_kv_heads", _kv_heads_split),
    Rule("gdn-state-split-over-tp", "srt/configs/mamba_utils.py: Mamba2StateShape.create; srt/distributed/utils.py: "
         "divide", _gdn_state_split),
    Rule("context-length-within-the-model", "srt/configs/model_config.py: ModelConfig._derive_context_length",
         _context_length),
    Rule("int2-kv", "the int2-kv overlay (sglang#32129): its host pool packs 4 codes per byte", _int2_kv),
    Rule("quant-method-known", "configs/model_config.py: _verify_quantization", _quant_method_known),
    Rule("quantization-loadable", "configs/model_config.py: _verify_quantization", _quantization_loadable),
    Rule("nvfp4-online-on-blackwell", "arg_groups/overrides.py: _moe_runner_backend_quant_constraints",
         _nvfp4_online_blackwell),
    Rule("escha-w2-needs-its-overlay", "the w2-weights overlay (Escha-W2 quantization layers)", _escha_w2),
    Rule("no-buffer-page-1", "arg_groups/mamba_hook.py: validate_mamba_no_buffer", _no_buffer_page),
    Rule("no-buffer-no-overlap", "arg_groups/mamba_hook.py: validate_mamba_no_buffer", _no_buffer_overlap),
    Rule("extra-buffer-track-interval", "arg_groups/mamba_hook.py: validate_mamba_extra_buffer",
         _extra_buffer_interval),
    Rule("aiter-not-on-cuda", "arg_groups/attention_hook.py: handle_attention_backend_compatibility; "
         "layers/attention/aiter_backend.py", _aiter_not_cuda),
    Rule("mla-backend-without-mla", "arg_groups/overrides.py: _mla_kv_cache_dtype_checks", _mla_backend),
    Rule("trtllm-mha-prefill-sm", "arg_groups/attention_hook.py: handle_attention_backend_compatibility",
         _trtllm_mha_prefill_sm),
    Rule("trtllm-mha-prefill-fp8-sm120", "arg_groups/attention_hook.py: handle_attention_backend_compatibility",
         _trtllm_mha_prefill_fp8),
    Rule("model-runner-attention-backend", "model_runner_components/attention_backend_setup.py: "
         "_build_resolved_backend; layers/attention/attention_registry.py", _model_runner_backends),
    Rule("flags-not-planned", "mem_cache/pool_host/page_interleave.py: PageInterleaveHostPool, and each pool "
         "the release's facts.yaml flags_not_planned names", _flags_not_planned),
    Rule("mixed-chunk-prefill-graph", "model_executor/runner/prefill_cuda_graph_runner.py: "
         "PrefillCudaGraphRunner.__init__", _mixed_chunk_prefill_graph),
    Rule("nvfp4-prefill-backends", "arg_groups/kv_cache_hook.py: handle_nvfp4_prefill_kv_dequant_dtype",
         _nvfp4_prefill),
    Rule("hybrid-mixed-chunk-needs-fix", "sglang#39342, fixed by sglang#39526", _hybrid_mixed_chunk),
    Rule("hybrid-mamba-slots", "mem_cache/kv_cache_configurator.py: _handle_max_mamba_cache", _hybrid_mamba_slots),
    Rule("hybrid-slots-per-request", "mem_cache/kv_cache_configurator.py: resolve_max_num_reqs",
         _hybrid_slots_per_request),
    Rule("hybrid-max-total-tokens", "mem_cache/kv_cache_configurator.py: resolve_max_num_reqs",
         _hybrid_max_total_tokens),
    Rule("min-total-tokens", "mem_cache/kv_cache_configurator.py: _apply_token_constraints", _min_total_tokens),
    Rule("int2-mixed-windows", "OSCAR-derived model_executor/pool_configurator.py: _compute_cell_size "
         "(SGLANG_ENABLE_MIXED_KV_WINDOWS)", _int2_mixed_windows),
    Rule("eagle-not-on-extra-buffer", "sglang#36537; sglang#30437", _eagle_extra_buffer),
    Rule("eagle-topk-page-backend", "arg_groups/speculative_hook.py: _handle_eagle_family", _eagle_topk_page_backend),
    Rule("eagle-topk-trtllm-mha", "arg_groups/speculative_hook.py: _handle_eagle_family", _eagle_topk_trtllm_mha),
    Rule("ngram-fa4-pages", "arg_groups/overrides.py: _fa4_page_constraint; arg_groups/speculative_hook.py: "
         "_handle_ngram", _ngram_fa4_pages),
    Rule("draft-not-counted", "planner/draft.py: draft_count (what SGLang loads that the plan cannot size)",
         _draft_not_counted),
    Rule("torch-compile-on-hybrid", "sglang#35777", _torch_compile_hybrid),
    Rule("hicache-needs-the-radix-cache", "arg_groups/kv_cache_hook.py: handle_cache_compatibility",
         _hicache_radix),
    Rule("hicache-no-int8-mamba-checkpoint", "arg_groups/mamba_hook.py", _hicache_int8_mamba),
    Rule("hicache-host-layout", "mem_cache/pool_host/mamba.py: MambaPoolHost; pool_host/mha.py; "
         "mem_cache/unified_radix_cache.py", _hicache_layout),
    Rule("l3-on-hybrid", "sglang#16771, #30055 (file); the backends' batch_*_v2", _l3_hybrid),
    Rule("l3-file-cap", "mem_cache/storage/file/lru_file_evictor.py: LRUFileEvictor", _l3_file_cap),
    Rule("mooncake-store", "mem_cache/storage/mooncake_store/mooncake_store.py: MooncakeStoreConfig.load_from_env",
         _mooncake_store),
    Rule("hicache-size-over-ratio", "mem_cache/pool_host/base.py: the host pool's size", _size_over_ratio),
    Rule("inert-keys", "profile.profile_only_warnings", _inert_keys),
)


def validate(profile: Profile, arch: ModelArch, capabilities: frozenset[str], *,
             page_size: int, mamba_slots: int, model_dir: ModelDirFacts | None = None,
             release: Release | None = None, draft: DraftCount | None = None) -> list[Finding]:
    """All configuration findings for ``profile`` on model ``arch``: each rule of ``RULES`` in
    order, its findings in its own order.

    ``page_size``: the plan's page (tokens); ``mamba_slots``: its device mamba slots per rank.
    ``model_dir``: what the model folder's config.json says (its derived context length).
    ``release``: the SGLang release planned (its facts: the rules only some releases have).
    ``draft``: what the plan counts of a speculative draft (``draft.draft_count``): each part it
    leaves uncounted is a warning."""
    inputs = Inputs(profile, arch, capabilities, page_size, mamba_slots, model_dir, release, draft)
    return [finding for rule in RULES for finding in rule.check(inputs)]
