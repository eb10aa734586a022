"""SGLang's file L3 store (``--hicache-storage-backend file``, ``HiCacheFile``) as data: which
TP ranks keep their own files, each under its own cap, and which files in the folder are a
server's own. Pure; the release's part is its ``file_store_owners`` fact (``releases``).

In SGLang 0.5.19 (and 0.5.21, the same code), ``srt/mem_cache/hicache_storage.py:
HiCacheFile.__init__`` suffixes every key with ``_{model}`` and, for a model whose KV is not
rank-replicated, ``_{tp_rank}_{tp_size}``; each rank builds its own ``LRUFileEvictor``
(``srt/mem_cache/storage/file/lru_file_evictor.py``), which scans only the files ending in its
suffix (``_scan_existing_files``) and holds them under ``SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE``
alone. So the cap is per rank: TP2 with a 512 GB cap can keep 1,024 GB on disk. A
rank-replicated model (MLA: ``MLATokenToKVPool``, and DeepSeek V4's compressed pool;
``srt/managers/cache_controller.py: _generate_storage_config``, ``is_rank_replicated``) shares
one file per page, owned by TP rank 0 alone (``LRUFileEvictor._is_storage_owner``). 0.5.23
keeps the per-rank cap and adds, for MLA, every rank's TP-sharded state (mamba) under its own
cap (``HiCacheFile.__init__``: ``tp_config_suffix``, ``owned_suffixes``).

Each evictor clamps its cap to the filesystem's size less ``SGLANG_HICACHE_FILE_BACKEND_MIN_FREE_SPACE``
and keeps that much free (``LRUFileEvictor.__init__``, ``_enforce_free_space_locked``; both
variables declared in ``srt/environ.py``, the watermark "0" by default).
"""

from __future__ import annotations

from dataclasses import dataclass

#: Architectures whose KV SGLang 0.5.19 keeps rank-replicated (``srt/configs/model_config.py:
#: ModelConfig._derive_model_shapes``, the branches that set ``AttentionArch.MLA``, and DeepSeek
#: V4's compressed pool, which ``cache_controller._generate_storage_config`` counts with them).
MLA_ARCHITECTURES = frozenset({
    "DeepseekV2ForCausalLM", "DeepseekV32ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV3ForCausalLMNextN",
    "Glm4MoeLiteForCausalLM", "Glm4MoeLiteForCausalLMNextN", "GlmMoeDsaForCausalLM", "GlmMoeDsaForCausalLMNextN",
    "LongcatFlashForCausalLM", "LongcatFlashForCausalLMNextN", "DotsVLMForCausalLM", "Dots3NoteForCausalLM",
    "Dots3NoteForCausalLMNextN", "MistralLarge3ForCausalLM", "MistralLarge3ForCausalLMEagle",
    "KimiK25ForConditionalGeneration", "Eagle3DeepseekV2ForCausalLM", "MiniCPM3ForCausalLM",
    "DeepseekV4ForCausalLM", "DeepseekV4ForCausalLMNextN", "DeepseekV4ForCausalLMDSpark",
})


def rank_replicated(config: dict) -> bool:
    """Whether SGLang keeps this config.json's KV rank-replicated (MLA): an architecture of
    ``MLA_ARCHITECTURES``, a Pixtral with ``kv_lora_rank``, a DeepSeek-VL2 unless ``use_mla`` is
    false (the same function's branches)."""
    archs = config.get("architectures") or []
    if not isinstance(archs, list):
        return False
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    if any(a in MLA_ARCHITECTURES for a in archs):
        return True
    if "PixtralForConditionalGeneration" in archs and text.get("kv_lora_rank") is not None:
        return True
    return "DeepseekVL2ForCausalLM" in archs and text.get("use_mla", True) is not False


@dataclass(frozen=True)
class Owners:
    """The ranks that keep their own files, each under its own cap: ``ranks`` of them, ``who``
    in words, ``source`` the release's."""

    ranks: int
    who: str
    source: str


def owners(release: str, tp_size: int, *, mla: bool, hybrid: bool) -> Owners:
    """Which ranks of a TP ``tp_size`` server of ``release`` keep their own file L3 files."""
    from escha_deploy.sglang.releases import load_release

    fact = load_release(release).file_store_owners
    if not mla:
        return Owners(tp_size, f"every TP rank ({tp_size}; keys suffixed _{{tp_rank}}_{{tp_size}})", fact.source)
    if fact.mla == "rank0-and-tp-sharded" and hybrid and tp_size > 1:
        return Owners(tp_size, f"every TP rank ({tp_size}): rank 0 the shared MLA files, each its own mamba state",
                      fact.source)
    return Owners(1, "TP rank 0 alone (MLA: the ranks share one file per page)", fact.source)


def own_file(name: str, tp_size: int, *, mla: bool) -> bool:
    """Whether ``name`` in the folder is a page file of a TP ``tp_size`` server's store that its
    ranks count and evict as their own (``LRUFileEvictor._scan_existing_files``: a ``.bin`` file
    whose stem ends in the rank's suffix). The model part of the suffix (the served model name)
    is not checked; for MLA every ``.bin`` file counts."""
    if not name.endswith(".bin"):
        return False
    if mla:
        return True
    stem = name[:-4]
    return any(stem.endswith(f"_{r}_{tp_size}") for r in range(tp_size))


def need_bytes(cap_per_rank: int, ranks: int, min_free: int) -> int:
    """Bytes of disk the store needs at most: each owning rank's cap, plus the watermark SGLang
    keeps free."""
    return cap_per_rank * ranks + min_free
