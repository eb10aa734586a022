"""Host pool sizes at a ratio or at a size, exactly as SGLang computes them (0.5.19 and 0.5.23 alike,
but for a speculative draft's sidecar pool: ``draft_sidecar``).

Sources (0.5.19 wheel): ``srt/mem_cache/pool_host/base.py: HostKVCache.__init__`` and
``pool_host/mamba.py: MambaPoolHost.__init__``:

- by ratio: ``size = int(device_size * ratio)``; by size: ``size = int(host_size_gb * 1e9 //
  size_per_token)``; then ``page_num = size // page_size + 1`` and ``size = page_num *
  page_size`` (always at least one extra page; the mamba host pool's page is 1 slot);
- requested bytes = ``size * size_per_token``;
- with ``--hicache-size`` on a hybrid model, ``hybrid_pool_assembler.py: _split_hicache_size``
  splits the GB between the pools in proportion to their device bytes (``get_kv_size_bytes()``
  and the mamba pool's bytes, padding included).

Check against the reference box (2 x RTX 5060 Ti, Qwen3.x-27B hybrid GDN, TP 2), ratio 2: KV int(210000*2)=420000 -> 52501 pages of 8 =
420,008 tokens x 6,144 B = 2,580,529,152 B; mamba int(16*2)+1 = 33 x 76,972,032 B =
2,540,077,056 B; two ranks pin 10,241,212,416 B.
"""

from __future__ import annotations

__all__ = ["PINNED_MAX_BYTES", "DevicePools", "HostPools", "PinnedBuffer", "host_buffers", "host_pools_at_ratio",
           "host_pools_at_size", "pinned_buffers"]

from dataclasses import dataclass, replace

from ..runtime.hooks.host_alloc import PINNED_BYTES_SOURCE, PINNED_MAX_BYTES
from ..runtime.hooks.host_alloc import pinned_bytes as allocator_pinned_bytes


@dataclass(frozen=True)
class DevicePools:
    """The device pools the host pools mirror (per rank)."""

    kv_tokens: int
    kv_bytes: int
    kv_page_size: int
    mamba_slots: int
    mamba_bytes: int
    mamba_bytes_per_slot: int
    host_kv_bytes_per_token: int
    #: Bytes per token of each separate host KV allocation, named; empty: one buffer of
    #: ``host_kv_bytes_per_token`` (K and V in one tensor, see ``host_buffers``).
    host_kv_buffers_per_token: tuple[tuple[str, int], ...] = ()
    #: GDN layers on this rank and their conv / temporal (SSM) state bytes per slot per layer.
    mamba_layers: int = 0
    mamba_conv_bytes_per_layer: int = 0
    mamba_temporal_bytes_per_layer: int = 0
    #: A speculative draft's sidecar host KV pool, bytes per token (0: none; a packed draft is in
    #: ``host_kv_bytes_per_token``): ``planner.draft.DraftHost``.
    draft_host_bytes_per_token: int = 0
    #: How the planned release sizes that sidecar (``releases.DraftHostPool.capacity``, its
    #: facts.yaml ``draft_host_pool``): ``ratio`` (an independent pool: page rounding plus one
    #: padding page) or ``shared`` (``host_token_capacity`` = the target host pool's tokens).
    draft_host_capacity: str = "ratio"
    #: The host mamba pool's state count set by patch 0004 (``ESCHA_HICACHE_HOST_MAMBA_SLOTS``,
    #: ``runtime_patches/0004-hicache-host-mamba-slots.patch``) in place of
    #: ``int(mamba_slots x ratio)``; None: SGLang's own rule (stock). Not a device pool: the host
    #: pools read it here, so every host constraint and search sees it.
    host_mamba_slots: int | None = None


@dataclass(frozen=True)
class HostPools:
    """Per-rank host pools: tokens, slots and requested bytes; ``buffers``: each single
    allocation ``(name, requested bytes)`` (``host_buffers``), filled by ``host_pools_at_*``."""

    kv_tokens: int
    kv_bytes: int
    mamba_slots: int
    mamba_bytes: int
    buffers: tuple[tuple[str, int], ...] = ()
    #: A speculative draft's sidecar host KV pool (``draft_sidecar``): tokens and requested bytes.
    draft_kv_tokens: int = 0
    draft_kv_bytes: int = 0

    @property
    def pinned_bytes(self) -> int:
        """Bytes these pools pin per rank: each buffer as its allocator pins it
        (``host_alloc.pinned_bytes``: the request rounded up to the 4 KiB page; both allocators
        pin alike), summed; ``kv_bytes + mamba_bytes`` for pools built without their buffers."""
        if not self.buffers:
            return self.kv_bytes + self.mamba_bytes + self.draft_kv_bytes
        return sum(allocator_pinned_bytes(b, "pinned") for _, b in self.buffers)


@dataclass(frozen=True)
class PinnedBuffer:
    """One host allocation per rank: what the pool requests and what its allocator pins.

    ``requested_bytes``: ``prod(dims) x itemsize`` as SGLang asks (``host_buffers``);
    ``pinned_bytes``: ``host_alloc.pinned_bytes(requested, allocator)``; ``allocator``:
    ``pinned`` (one exact cudaHostAlloc) or ``register`` (mmap + cudaHostRegister);
    ``source``: the rule, for ``plan``'s lines."""

    name: str
    requested_bytes: int
    pinned_bytes: int
    allocator: str
    source: str


def pinned_buffers(pools: HostPools, allocator: str) -> list[PinnedBuffer]:
    """Each of ``pools.buffers`` with the bytes ``allocator`` (``pinned`` or ``register``) pins. Pure."""
    src = PINNED_BYTES_SOURCE[allocator]
    return [PinnedBuffer(name=n, requested_bytes=b, pinned_bytes=allocator_pinned_bytes(b, allocator),
                         allocator=allocator, source=src) for n, b in pools.buffers]


def _with_buffers(dev: DevicePools, pools: HostPools) -> HostPools:
    """``pools`` with its buffers, when ``dev`` names them all (their requested bytes add up to
    the pools'); a ``DevicePools`` without the per-layer mamba shapes keeps the pool totals."""
    pools = draft_sidecar(dev, pools)
    buffers = tuple(host_buffers(dev, pools))
    if sum(b for _, b in buffers) != pools.kv_bytes + pools.mamba_bytes + pools.draft_kv_bytes:
        return pools
    return replace(pools, buffers=buffers)


def _round_pages(size: int, page_size: int) -> int:
    return (size // page_size + 1) * page_size


def draft_sidecar(dev: DevicePools, pools: HostPools) -> HostPools:
    """``pools`` with a speculative draft's sidecar host KV pool (``dev.draft_host_bytes_per_token``
    > 0), as the planned release builds it (``hybrid_pool_assembler.py: build_full_draft_pools``):
    ``MHATokenToKVPoolHost`` over the draft's device pool (the target's token count) at
    ``host_to_device_ratio = target host tokens / draft device tokens``. ``dev.draft_host_capacity``
    ``ratio`` (0.5.19's facts): ``int(tokens * ratio)`` in floating point, then ``pool_host/base.py:
    HostKVCache.__init__``'s page rounding plus one padding page; ``shared`` (0.5.23's): the pool
    gets ``host_token_capacity`` = the target host pool's ``logical_size`` (its tokens, already
    page-aligned, padding page included) and ``HostKVCache.__init__`` adds no page of its own."""
    if not dev.draft_host_bytes_per_token or not pools.kv_tokens or not dev.kv_tokens:
        return pools
    if dev.draft_host_capacity == "shared":
        tokens = pools.kv_tokens
    else:
        tokens = _round_pages(int(dev.kv_tokens * (pools.kv_tokens / dev.kv_tokens)), dev.kv_page_size)
    return replace(pools, draft_kv_tokens=tokens, draft_kv_bytes=tokens * dev.draft_host_bytes_per_token)


def _host_mamba_slots(dev: DevicePools, stock: int) -> int:
    """The host mamba pool's slots: SGLang's count (``stock``), or patch 0004's
    ``dev.host_mamba_slots`` in its place (``escha_host_mamba_slots.host_mamba_size``), plus the
    one extra slot ``MambaPoolHost.__init__``'s page count adds either way."""
    return _round_pages(dev.host_mamba_slots if dev.host_mamba_slots is not None else stock, 1)


def host_pools_at_ratio(dev: DevicePools, ratio: float) -> HostPools:
    """Per-rank host pools at ``--hicache-ratio ratio``."""
    kv_tokens = _round_pages(int(dev.kv_tokens * ratio), dev.kv_page_size)
    slots = _host_mamba_slots(dev, int(dev.mamba_slots * ratio)) if dev.mamba_slots else 0
    return _with_buffers(dev, HostPools(
        kv_tokens=kv_tokens, kv_bytes=kv_tokens * dev.host_kv_bytes_per_token,
        mamba_slots=slots, mamba_bytes=slots * dev.mamba_bytes_per_slot,
    ))


def host_pools_at_size(dev: DevicePools, size_gb: int) -> HostPools:
    """Per-rank host pools at ``--hicache-size size_gb`` (GB = 1e9, per rank).

    A hybrid model with no linear-attention layer (``full_attention_interval`` 1, slots set by
    ``runtime.max_mamba_cache_size``) has 0 B of mamba state per slot: SGLang's split gives its
    mamba pool 0 GB, and ``MambaPoolHost.__init__`` (``host_size > 0`` false) sizes it by ratio
    instead, at 0 B a slot; the bytes are 0 either way, so the slot count is kept at the
    device pool's plus the padding slot rather than modelled (dividing by the 0 B crashed)."""
    if dev.mamba_slots:
        total = dev.kv_bytes + dev.mamba_bytes
        kv_gb = size_gb * dev.kv_bytes / total
        mamba_gb = size_gb * dev.mamba_bytes / total
    else:
        kv_gb, mamba_gb = float(size_gb), 0.0
    kv_tokens = _round_pages(int(kv_gb * 1e9 // dev.host_kv_bytes_per_token), dev.kv_page_size)
    if not dev.mamba_slots:
        slots = 0
    elif not dev.mamba_bytes_per_slot:
        slots = _round_pages(dev.mamba_slots, 1)
    else:
        slots = _host_mamba_slots(dev, int(mamba_gb * 1e9 // dev.mamba_bytes_per_slot))
    return _with_buffers(dev, HostPools(
        kv_tokens=kv_tokens, kv_bytes=kv_tokens * dev.host_kv_bytes_per_token,
        mamba_slots=slots, mamba_bytes=slots * dev.mamba_bytes_per_slot,
    ))


def host_buffers(dev: DevicePools, pools: HostPools) -> list[tuple[str, int]]:
    """Each single host allocation of these pools (per rank) as ``(name, bytes)``.

    Sources (0.5.19 wheel, ``srt/mem_cache/pool_host/``):

    - ``mha.py: MHATokenToKVPoolHost.init_kv_buffer`` allocates K and V as ONE tensor in every
      layout (``(2, layer_num, size, head_num, head_dim)`` layer_first, ``(2, size, ...)``
      page_first, ``(2, page_num, ...)`` page_first_direct / page_head): ``size *
      size_per_token`` bytes. The INT2 host pool keeps the packed codes (K and V) in that buffer
      and scales/zeros in two more (K, V): ``dev.host_kv_buffers_per_token`` names them.
    - ``mamba.py: MambaPoolHost.__init__`` allocates the temporal (SSM) state as one tensor
      ``(num_mamba_layers, size, *temporal_shape)`` (or ``(size, num_mamba_layers, 1, ...)``
      page-first: the same bytes) and one conv tensor per conv state shape (GDN has one).

    - a speculative draft's sidecar host pool (``draft_sidecar``): one K-and-V buffer, as the
      target's.

    The sum equals ``pools.kv_bytes + pools.mamba_bytes + pools.draft_kv_bytes`` (requested bytes).
    """
    parts = dev.host_kv_buffers_per_token or (("host KV buffer (K and V)", dev.host_kv_bytes_per_token),)
    out = [(name, pools.kv_tokens * per_token) for name, per_token in parts if pools.kv_tokens]
    if pools.draft_kv_tokens:
        out.append(("host draft KV buffer (sidecar)", pools.draft_kv_bytes))
    if pools.mamba_slots:
        out.append(("host mamba temporal buffer",
                    pools.mamba_slots * dev.mamba_layers * dev.mamba_temporal_bytes_per_layer))
        out.append(("host mamba conv buffer",
                    pools.mamba_slots * dev.mamba_layers * dev.mamba_conv_bytes_per_layer))
    return out
