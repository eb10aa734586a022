"""The device side: SGLang's default ``--mem-fraction-static`` and whether weights plus pools
fit the static budget.

SGLang 0.5.19 sizes pools from what is left after the weights
(``srt/mem_cache/kv_cache_configurator.py: KVCacheConfigurator._profile_available_bytes``):
``rest = available_after_weights - pre_model_load_free * (1 - mem_fraction_static)``, so the
static budget for weights + pools is ``pre_model_load_free * mem_fraction_static``. Free memory
before the weights is the card's VRAM less the CUDA context and, under WSL2, the VRAM the
platform keeps hidden (about 1.31 GiB per GPU, held by WDDM/GPU-PV).

Default fraction (``srt/arg_groups/memory_hook.py: handle_gpu_memory_settings``), ``gpu_mem``
in MiB: ``reserved = 512 + max(chunked_prefill, 2048) * 1.5 + tp*pp/8 * 1024 +
decode_max_bs * 2 + len(prefill graph sizes) * 8`` (non-MLA, prefill graphs on); fraction =
``round((gpu_mem - reserved) / gpu_mem, 3)``. Below 20 GiB: chunked prefill 2048, decode
graph max bs 8. Worked example (memory research 1.2): 12,288 MiB at TP2 -> reserved 4,192 MiB,
fraction 0.659.
"""

from __future__ import annotations

from ..utils.units import MiB


def prefill_graph_sizes(max_bs: int) -> list[int]:
    """``srt/arg_groups/cuda_graph_hook.py: generate_prefill_cuda_graph_batch_sizes``."""
    sizes = (
        list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32))
        + list(range(576, 1024 + 1, 64)) + list(range(1280, 4096 + 1, 256))
        + list(range(4608, max_bs + 1, 512))
    )
    return [s for s in sizes if s <= max_bs]


def tier_defaults(gpu_mem_mib: int, tp: int, release: str | None = None) -> tuple[int, int]:
    """``(chunked_prefill_size, decode_cuda_graph_max_bs)`` SGLang picks for a card of
    ``gpu_mem_mib`` MiB: the release's memory tiers (``releases/VERSION/facts.yaml``, read from
    its ``handle_gpu_memory_settings``; default: the default release)."""
    from ..sglang.releases import load_release

    tier = load_release(release).memory_defaults.tier(gpu_mem_mib)
    return tier.chunked_prefill, tier.decode_max_bs if tp < 4 else tier.decode_max_bs_tp4


def sglang_decode_max_bs(gpu_mem_mib: int, tp: int, decode_max_bs: int | None, *, release: str | None = None,
                         max_running_requests: int | None = None) -> int:
    """The decode CUDA-graph max batch size SGLang ``release`` uses: ``decode_max_bs`` when
    given, else the card's tier default, lowered to ``--max-running-requests`` where the release
    caps a default at it (0.5.22+, ``memory_hook.py: handle_gpu_memory_settings``)."""
    from ..sglang.releases import load_release

    if decode_max_bs:
        return decode_max_bs
    _, bs = tier_defaults(gpu_mem_mib, tp, release)
    if (max_running_requests is not None and bs > max_running_requests
            and load_release(release).memory_defaults.decode_max_bs_capped_by_max_running_requests):
        return max_running_requests
    return bs


def sglang_reserved_mib(gpu_mem_mib: int, tp: int, *, chunked_prefill: int | None,
                        decode_max_bs: int | None, prefill_graphs: bool = True, pp: int = 1,
                        release: str | None = None, max_running_requests: int | None = None) -> float:
    """SGLang's activation + CUDA-graph reserve in MiB (``handle_gpu_memory_settings``) in
    ``release`` (default: the default release): its tiers, and where the release caps a default
    decode max batch size at ``--max-running-requests`` (0.5.22+), that cap."""
    default_chunk, _ = tier_defaults(gpu_mem_mib, tp, release)
    chunk = chunked_prefill if chunked_prefill and chunked_prefill > 0 else default_chunk
    bs = sglang_decode_max_bs(gpu_mem_mib, tp, decode_max_bs, release=release,
                              max_running_requests=max_running_requests)
    reserved = 512 + max(chunk, 2048) * 1.5 + tp * pp / 8 * 1024 + bs * 2
    if prefill_graphs:
        reserved += len(prefill_graph_sizes(chunk)) * 8
    if gpu_mem_mib > 60 * 1024:
        reserved = max(reserved, 10240)
    return reserved


def sglang_default_mem_fraction(gpu_mem_bytes: int, tp: int, *, chunked_prefill: int | None,
                                decode_max_bs: int | None, prefill_graphs: bool = True,
                                release: str | None = None, max_running_requests: int | None = None) -> float:
    """The ``--mem-fraction-static`` SGLang ``release`` would pick for this card (3 decimals)."""
    gpu_mem_mib = gpu_mem_bytes // MiB
    reserved = sglang_reserved_mib(gpu_mem_mib, tp, chunked_prefill=chunked_prefill,
                                   decode_max_bs=decode_max_bs, prefill_graphs=prefill_graphs,
                                   release=release, max_running_requests=max_running_requests)
    return round((gpu_mem_mib - reserved) / gpu_mem_mib, 3)


def sglang_min_reserved_mib(tp: int, pp: int = 1) -> float:
    """The least device memory SGLang 0.5.19 ever keeps outside ``mem_fraction_static``:
    ``1536 + tp * pp / 8 * 1024`` MiB, its reserve when the KV pool is sized after CUDA-graph
    capture (``srt/arg_groups/memory_hook.py: handle_gpu_memory_settings``, post-capture
    branch: "keep only the floor + parallel slack"). Below it not even the activation floor
    and the communication buffers fit, before any CUDA graph; 1,792 MiB (1.88 GB) at TP 2."""
    return 1536 + tp * pp / 8 * 1024
