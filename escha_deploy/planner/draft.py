"""The speculative-decoding draft model in the device budget: what of it the plan counts, and why.

One decision (``draft_count``), made once before the planner's steps from the profile
(``model.draft``, ``runtime.speculative.algorithm``: ``--speculative-algorithm``) and what the draft's
folder says (``arch.DraftFacts``, read at the I/O edge as the model folder is). The steps use
its figures; the validate step turns what it leaves uncounted into warnings. SGLang 0.5.19:

- **weights**: the scheduler builds the draft worker (``managers/scheduler.py:
  Scheduler.maybe_init_draft_worker``), which loads the draft's weights, before either worker
  sizes its KV pool (``speculative/eagle_worker_v2.py``: ``EagleDraftWorker`` builds its
  ``TpModelWorker`` in ``__init__``, pools come later from ``alloc_memory_pool``); the target's
  budget is the free memory measured then, so both workers' weights come out of it
  (``mem_cache/kv_cache_configurator.py: KVCacheConfigurator._profile_available_bytes``:
  "Loaded weights (target + draft) ... draft weights are now counted"). The draft runs at the
  target's TP size, so each rank holds its safetensors / ``tp_size``, as the target's.
- **KV**: for EAGLE, EAGLE3, NEXTN (SGLang's alias of EAGLE: ``arg_groups/speculative_hook.py:
  _resolve_speculative_algorithm_alias``) and STANDALONE with a draft path, the target scales
  its KV cell per token by ``1 + draft layers / target KV layers``
  (``model_executor/pool_configurator.py: DefaultPoolConfigurator.__init__``,
  ``int(cell * (1 + draft / layers))``; the draft layers are ``eagle_draft_num_layers``,
  ``model_runner_components/spec_aux_hidden_state.py: _resolve_eagle_aux_hidden_state``, which
  reads them only when ``--speculative-draft-model-path`` is given) and the draft worker reuses
  the target's token count (``KVCacheConfigurator.configure``: the draft takes the target's
  ``memory_pool_config``). Without a draft path (NEXTN on the model's own MTP layers) the cell
  is not scaled, and the draft's pool, allocated afterwards, is not in SGLang's sizing either.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..sglang.arch import DraftFacts
from ..profile import Profile
from ..profile.rules import extra_arg, speculative_algorithm
from ..utils.units import fmt_gb

#: Algorithms whose draft KV SGLang prices by layer count in the target's cell
#: (``pool_configurator.py``: ``spec_algorithm.is_eagle() or is_standalone()``; NEXTN is EAGLE).
KV_BY_LAYERS = frozenset({"EAGLE", "EAGLE3", "NEXTN", "STANDALONE"})
#: Algorithms without a draft model (``speculative/ngram_worker.py``: "NGRAM has no draft
#: weights of its own").
NO_DRAFT_MODEL = frozenset({"NGRAM"})
#: Where a draft's weights come out of the budget (the plan's line for them).
WEIGHTS_SOURCE = ("loaded before the pools are sized (kv_cache_configurator.py: "
                  "KVCacheConfigurator._profile_available_bytes: target + draft weights)")
KV_SOURCE = "pool_configurator.py: DefaultPoolConfigurator.__init__, int(cell x (1 + draft layers / KV layers))"


#: ``--max-running-requests`` SGLang sets when it is unset under every speculative algorithm of
#: 0.5.19 and 0.5.23 (``arg_groups/speculative_hook.py``: ``_handle_eagle_family``, ``_handle_ngram``,
#: ``_handle_dflash``, ``_handle_dspark``: "Max running requests is reset to 48 for speculative
#: decoding").
SPEC_MAX_RUNNING_REQUESTS = 48
#: The EAGLE family's worker (``_handle_eagle_family``; NEXTN resolves to EAGLE).
EAGLE_FAMILY = frozenset({"EAGLE", "EAGLE3", "NEXTN", "STANDALONE"})
#: Algorithms whose draft shares the target's host KV pool when its config has MTP layers: EAGLE
#: but not EAGLE3 (``speculative/base_spec_worker.py: _can_pack_hicache_mtp``: ``is_eagle() and
#: not is_eagle3()`` with ``num_nextn_predict_layers`` on every draft runner; NEXTN is EAGLE).
PACKABLE = frozenset({"EAGLE", "NEXTN"})
#: Target ``model_type``s whose own folder SGLang drafts from with one MTP layer when no draft path
#: is given (``managers/tp_worker.py: _init_model_config`` falls back to ``--model-path``;
#: ``configs/model_config.py: _config_draft_model`` sets ``num_nextn_predict_layers = 1``).
MTP_MODEL_TYPES = frozenset({"qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"})


@dataclass(frozen=True)
class SpecShape:
    """The speculative configuration SGLang resolves from ``runtime.speculative`` (both releases,
    ``arg_groups/speculative_hook.py``): ``num_draft_tokens`` per request per step (0: no
    speculation, or an algorithm whose default this plan does not mirror), ``source`` (why);
    ``max_running_requests`` (the profile's, else ``SPEC_MAX_RUNNING_REQUESTS`` under an algorithm,
    else None) and ``mrr_source``; ``problems``: ``(key, message)`` for a shape SGLang's
    resolution refuses."""

    num_draft_tokens: int = 0
    source: str = ""
    max_running_requests: int | None = None
    mrr_source: str = ""
    problems: tuple[tuple[str, str], ...] = ()


#: ``--speculative-ngram-max-bfs-breadth``'s default (SGLang 0.5.19 and 0.5.23 ``server_args.py``),
#: the top-k ``_handle_ngram`` gives NGRAM
NGRAM_MAX_BFS_BREADTH = 10


def spec_shape(profile: Profile) -> SpecShape:
    """What SGLang's ``_handle_eagle_family`` / ``_handle_ngram`` resolve (``SpecShape``):

    - EAGLE family, ``num_steps`` unset: ``eagle_topk`` and ``num_draft_tokens`` must be unset
      too (an assert), then ``_auto_choose_speculative_params``: (3, 1, 4), (5, 4, 8) for a Llama
      target; ``num_steps`` set: ``eagle_topk`` must be (SGLang compares it), and with top-k 1 the
      draft tokens become ``num_steps + 1`` ("speculative_num_draft_tokens is adjusted"), with
      top-k above 1 they must be given (``_handle_max_mamba_cache`` asserts them);
    - NGRAM: ``num_draft_tokens`` else 12; its top-k is ``--speculative-ngram-max-bfs-breadth``
      (10), refused above 1 with pages above 1 outside flashinfer;
    - any algorithm with ``runtime.attention_backend`` flex_attention is refused
      (``arg_groups/attention_hook.py``);
    - DFLASH, DSPARK: their block size, not mirrored here (0).
    """
    rt = profile.runtime
    sp = rt.speculative
    if sp is None:
        return SpecShape(max_running_requests=rt.max_running_requests,
                         mrr_source="runtime.max_running_requests" if rt.max_running_requests else "")
    alg = sp.algorithm.upper()
    mrr, mrr_src = ((rt.max_running_requests, "runtime.max_running_requests") if rt.max_running_requests else
                    (SPEC_MAX_RUNNING_REQUESTS, f"{SPEC_MAX_RUNNING_REQUESTS}: SGLang's default under speculative "
                     "decoding when runtime.max_running_requests is unset (speculative_hook.py: _handle_eagle_family)"))
    problems: list[tuple[str, str]] = []
    d, src = 0, ""
    if alg in EAGLE_FAMILY:
        if sp.num_steps is None:
            for key, value in (("eagle_topk", sp.eagle_topk), ("num_draft_tokens", sp.num_draft_tokens)):
                if value is not None:
                    problems.append((f"runtime.speculative.{key}", "set without runtime.speculative.num_steps: SGLang "
                                     "asserts both unset when the steps are (speculative_hook.py: _handle_eagle_family); "
                                     "set num_steps too, or none of the three"))
            steps, topk, d = (5, 4, 8) if profile.model.architecture.model_type == "llama" and alg != "STANDALONE"                 else (3, 1, 4)
            src = (f"SGLang's ({steps}, {topk}, {d}) for num_steps, eagle_topk, num_draft_tokens "
                   "(speculative_hook.py: _auto_choose_speculative_params)")
        elif sp.eagle_topk is None:
            problems.append(("runtime.speculative.eagle_topk", "unset with runtime.speculative.num_steps set: SGLang "
                             "compares it (speculative_hook.py: _handle_eagle_family) and stops; set it (1: a chain)"))
        elif sp.eagle_topk == 1:
            d, src = sp.num_steps + 1, ("num_steps + 1 with eagle_topk 1 (speculative_hook.py: _handle_eagle_family: "
                                        "\"speculative_num_draft_tokens is adjusted\")")
        elif sp.num_draft_tokens is None:
            problems.append(("runtime.speculative.num_draft_tokens", f"unset with eagle_topk {sp.eagle_topk}: SGLang "
                             "needs it to size the draft (kv_cache_configurator.py: _handle_max_mamba_cache asserts it)"))
        else:
            d, src = sp.num_draft_tokens, "runtime.speculative.num_draft_tokens"
    elif alg == "NGRAM":
        d, src = ((sp.num_draft_tokens, "runtime.speculative.num_draft_tokens") if sp.num_draft_tokens else
                  (12, "SGLang's 12 for NGRAM (speculative_hook.py: _handle_ngram)"))
        # _handle_ngram sets the top-k to --speculative-ngram-max-bfs-breadth (SGLang's default 10), then
        # refuses a top-k above 1 with pages above 1 outside the flashinfer backend (0.5.19 and 0.5.23)
        raw = extra_arg(rt.extra_args or [], "--speculative-ngram-max-bfs-breadth")
        breadth = int(raw) if raw is not None and raw.lstrip("-").isdigit() else NGRAM_MAX_BFS_BREADTH
        if breadth > 1 and (rt.page_size or 1) > 1 and rt.attention_backend != "flashinfer":
            problems.append(("runtime.speculative.algorithm", (
                f"NGRAM with page size {rt.page_size}: SGLang sets the top-k to --speculative-ngram-max-bfs-breadth "
                f"({breadth}) and refuses a top-k above 1 with pages above 1 outside the flashinfer backend "
                "(speculative_hook.py: _handle_ngram: 'unstable and produces incorrect results for paged attention "
                "backends'); set runtime.attention_backend flashinfer, runtime.page_size 1, or "
                "--speculative-ngram-max-bfs-breadth 1")))
    if rt.attention_backend == "flex_attention":
        problems.append(("runtime.speculative.algorithm", (
            f"{alg} with runtime.attention_backend flex_attention: SGLang asserts no speculative algorithm with "
            "it (arg_groups/attention_hook.py: 'Speculative decoding is currently not supported with Flex "
            "Attention backend'); choose another backend")))
    return SpecShape(num_draft_tokens=d, source=src, max_running_requests=mrr, mrr_source=mrr_src,
                     problems=tuple(problems))


@dataclass(frozen=True)
class DraftHost:
    """How SGLang mirrors the draft's KV into host memory with HiCache on
    (``speculative/base_spec_worker.py: _build_hicache_draft_plan``): ``mode`` ``packed`` (the
    draft's layers ride in the target's host KV pool: ``layers`` more layers in its ``layer_num``,
    ``pool_host/mha.py: MHATokenToKVPoolHost.get_size_per_token``), ``sidecar`` (a host pool of
    its own over the draft's device pool, ``hybrid_pool_assembler.py: build_full_draft_pools``:
    ``layers`` layers of ``kv_heads`` x ``head_dim`` per rank, at the target host pool's tokens) or
    ``""`` (no draft runner: nothing mirrored); ``source`` why; ``not_counted`` a line when SGLang
    mirrors something this plan cannot size."""

    mode: str = ""
    layers: int = 0
    kv_heads: int = 0
    head_dim: int = 0
    source: str = ""
    not_counted: str = ""


def draft_host(profile: Profile, draft: DraftFacts | None) -> DraftHost:
    """The draft's host KV under HiCache (``DraftHost``), from the algorithm, the draft's folder
    (``DraftFacts.nextn_layers``, its KV geometry) and, without ``model.draft``, the target's own
    MTP layers (``MTP_MODEL_TYPES``: SGLang drafts from ``--model-path``). One draft runner (no
    ``--enable-multi-layer-eagle``): one packed layer."""
    alg = speculative_algorithm(profile)
    if alg is None or alg in NO_DRAFT_MODEL or not profile.hicache.enabled:
        return DraftHost()
    tp = profile.runtime.tp_size
    multi = "--enable-multi-layer-eagle" in profile.runtime.extra_args
    if alg in ("DFLASH", "DSPARK") or multi:
        return DraftHost(not_counted=f"speculative {alg}{' with --enable-multi-layer-eagle' if multi else ''}: SGLang "
                         "mirrors the draft's KV into host memory (base_spec_worker.py: _build_hicache_draft_plan), "
                         "which this plan does not size: leave host headroom")
    if profile.model.draft is None:
        nextn = 1 if profile.model.architecture.model_type in MTP_MODEL_TYPES else 0
        where = "the model's own MTP layer (no draft path: SGLang drafts from --model-path, tp_worker.py)"
    elif draft is None:
        return DraftHost(not_counted=f"speculative {alg}: the draft's host KV cache (HiCache mirrors it, "
                         "base_spec_worker.py: _build_hicache_draft_plan) is not counted: its folder is not here")
    else:
        nextn, where = draft.nextn_layers, f"the draft in {draft.path}"
    if alg in PACKABLE and nextn:
        return DraftHost(mode="packed", layers=1, source=(
            f"{alg}: {where} has MTP layers, so HiCache packs its KV into the target's host pool, one layer per draft "
            "runner (base_spec_worker.py: _can_pack_hicache_mtp; pool_host/mha.py: get_size_per_token, layer_num = "
            "target layers + draft layers)"))
    if draft is None or not (draft.num_layers and draft.kv_heads and draft.head_dim):
        return DraftHost(not_counted=f"speculative {alg}: the draft's host KV pool (a sidecar, "
                         "hybrid_pool_assembler.py: build_full_draft_pools) is not counted: the draft's config.json "
                         "names no KV geometry here")
    return DraftHost(mode="sidecar", layers=draft.num_layers, kv_heads=max(1, draft.kv_heads // tp),
                     head_dim=draft.head_dim, source=(
        f"{alg}: {where} is mirrored by a host pool of its own at the target host pool's tokens "
        "(base_spec_worker.py: _build_hicache_draft_plan, SIDECAR; hybrid_pool_assembler.py: build_full_draft_pools)"))


@dataclass(frozen=True)
class DraftCount:
    """What the plan counts of the draft, per rank: ``weights_bytes`` (0: none counted) and
    where they came from; ``layers``, the draft layers the target's KV cell is scaled by (0:
    not scaled), and why; ``algorithm``, ``--speculative-algorithm`` as SGLang reads it
    (upper-cased; ``None``: no speculative decoding); ``not_counted``: one line per part of the
    draft the plan does not count, with the reason (the validate step's warnings)."""

    algorithm: str | None = None
    weights_bytes: int = 0
    weights_source: str = ""
    layers: int = 0
    layers_source: str = ""
    not_counted: tuple[str, ...] = ()

    @property
    def counted(self) -> bool:
        return bool(self.weights_bytes or self.layers)


def draft_count(profile: Profile, draft: DraftFacts | None) -> DraftCount:
    """The one decision on the draft (module docstring). ``draft``: what ``model.draft``'s folder
    says (``None``: no key, or the folder is not on this machine)."""
    alg = speculative_algorithm(profile)
    key = profile.model.draft
    tp = profile.runtime.tp_size
    if alg is None or alg in NO_DRAFT_MODEL:
        return DraftCount(algorithm=alg)  # model.draft without an algorithm: profile rules warn (inert key)
    if key is None:
        return DraftCount(algorithm=alg, not_counted=(
            f"--speculative-algorithm {alg}: the draft model's weights and KV cache are not in this plan (no "
            "model.draft; for NEXTN the draft is the model's own MTP layers, and without a draft path SGLang "
            "sizes no KV for it either, spec_aux_hidden_state.py: _resolve_eagle_aux_hidden_state): leave device "
            "headroom, or name the draft's folder in model.draft {path, host_dir} (for NEXTN: the model's own)",))
    if draft is None:
        where = f"model.draft.host_dir {key.host_dir} is not a folder here" if key.host_dir else \
            "model.draft.host_dir is not set, so its folder cannot be read"
        return DraftCount(algorithm=alg, not_counted=(
            f"--speculative-algorithm {alg}: the draft in model.draft.path {key.path} is not counted in this plan's "
            f"device budget ({where}): its weights and KV cache share the static budget",))
    missing: list[str] = []
    weights, wsrc = 0, ""
    if draft.weights_bytes:
        weights = draft.weights_bytes // tp
        wsrc = f"{draft.weights_source}: {fmt_gb(draft.weights_bytes)} / tp {tp}, {WEIGHTS_SOURCE}"
    else:
        what = ("no tensor named 'mtp' in the model's own safetensors" if draft.own_folder
                else f"no *.safetensors in {draft.path}")
        missing.append(f"--speculative-algorithm {alg}: the draft's weights are not counted ({what})")
    layers, lsrc = 0, ""
    if alg in KV_BY_LAYERS:
        if draft.num_layers:
            layers, lsrc = draft.num_layers, draft.layers_source
        else:
            missing.append(f"--speculative-algorithm {alg}: the draft's KV cache is not counted (its config.json in "
                           f"{draft.path} names no num_nextn_predict_layers or num_hidden_layers)")
    else:
        missing.append(f"--speculative-algorithm {alg}: the draft's KV cache is not counted (SGLang sizes this "
                       "algorithm's draft KV from its own geometry, pool_configurator.py; this plan does not mirror it)")
    return DraftCount(algorithm=alg, weights_bytes=weights, weights_source=wsrc, layers=layers, layers_source=lsrc,
                      not_counted=tuple(missing))


def scaled_cell(cell: int, kv_layers: int, draft_layers: int, rounding: str = "whole") -> int:
    """The target's KV bytes per token with the draft's layers, as SGLang computes it
    (``KV_SOURCE``; the float expressions kept as written, so the rounding is SGLang's), by the
    planned release's ``rounding`` (its facts.yaml ``draft_kv_cell``, ``releases.DraftKvCell``):
    ``whole`` ``int(cell * (1 + draft_layers / kv_layers))`` (0.5.19); ``draft_share`` adds the
    draft's share rounded on its own, ``cell + int(cell * draft_layers / kv_layers)`` (0.5.23's
    ``DefaultPoolConfigurator.__init__``, without unified memory, which fuses the draft instead).
    ``cell`` when either count is 0."""
    if draft_layers <= 0 or kv_layers <= 0:
        return cell
    if rounding == "draft_share":
        return cell + int(cell * draft_layers / int(kv_layers))
    return int(cell * (1 + draft_layers / int(kv_layers)))


#: Where the intermediate mamba states come from (both releases).
INTERMEDIATE_SOURCE = ("kv_cache_configurator.py: KVCacheConfigurator._handle_max_mamba_cache: "
                       "mamba_cache_per_req x (capped_reqs + 1) x speculative_num_draft_tokens")


def intermediate_mamba(per_slot: int, requests: int, draft_tokens: int) -> int:
    """Bytes of the intermediate mamba states SGLang reserves out of the KV budget under
    speculation on a hybrid model (``INTERMEDIATE_SOURCE``): one state per draft token for each of
    ``requests`` (``min(max_running_requests, slots // slots per request)``, or the slots with the
    radix cache off) and the pool's padding request. ``per_slot``: bytes of one state (all GDN
    layers of a rank)."""
    return per_slot * (requests + 1) * draft_tokens


def mamba_slots_with_speculation(rest: int, per_slot: int, draft_tokens: int, ratio: int, r: float) -> int:
    """``max_mamba_cache_size`` SGLang solves jointly with the intermediate states when it sizes
    the slots itself (``_handle_max_mamba_cache``, "Joint solve"): ``int((budget - per_slot x (1 +
    D)) // (per_slot x (1 + D / ratio)))`` with ``budget = rest x r / (1 + r)`` (``r``:
    ``--mamba-full-memory-ratio``), in SGLang's floating point (GiB, then bytes)."""
    budget = (rest / (1 << 30)) * r / (1 + r) * (1 << 30)
    return int((budget - per_slot * (1 + draft_tokens)) // (per_slot * (1 + draft_tokens / ratio)))
