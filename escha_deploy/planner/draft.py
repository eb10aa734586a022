"""The speculative-decoding draft model in the device budget: what of it the plan counts, and why.

One decision (``draft_count``), made once before the planner's steps from the profile
(``model.draft``, ``--speculative-algorithm`` in ``runtime.extra_args``) and what the draft's
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

from ..arch import DraftFacts
from ..profile import Profile
from ..profile.rules import speculative_algorithm
from ..units import fmt_gb

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
