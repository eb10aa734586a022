#!/usr/bin/env python3
"""CPU replay of SGLang 0.5.19's own hybrid (GDN/mamba + full attention) radix cache with HiCache.

What the replay found (SGLang 0.5.19, python tree core, one request at a time):

- A hybrid prefix is reusable only up to a node holding a mamba state, on the device or (for a
  load-back) on the host (``unified_cache/components/mamba_component.py:
  create_match_validator``, ``finalize_match_result_in_tree_core``). With ``extra_buffer`` a
  state is kept only at (a) each prefill chunk's end, rounded down to the 64-token grid
  (``schedule_batch.py: _mamba_radix_cache_v2_req_prepare_for_extend``,
  ``mamba_last_track_seqlen``; inserted by ``cache_unfinished_req(chunked=True)`` and by the
  post-prefill ``cache_unfinished_req``), (b) a matched request's branching point
  (``mamba_branching_seqlen``, the last grid point of the Full-KV hit), and (c) decode track
  boundaries every 256 tokens (never reached here). ``cache_finished_req`` adds none
  (``MambaComponent.cleanup_after_caching_req`` reset ``mamba_last_track_seqlen`` to None after
  the post-prefill insert). A match never reaches the last input token (``Req.
  _compute_max_prefix_len``: ``input_len - 1``), so a request's own end state is useless to an
  identical ask and a state past a shared prefix is useless to a different question.
- Device mamba slots are the scarce resource: every admitted chunk wants 3 free slots (running
  + 2 ping-pong, ``allocation.py: alloc_req_slots``, ``MAMBA_STATE_PER_REQ_PREFIX_CACHE``), so
  with 10 slots each chunk evicts the LRU states; an internal node's state is tombstoned
  without touching its Full KV (``MambaComponent._evict_device_next_node``), a leaf leaves the
  device whole (``UnifiedRadixCache._evict_device_leaf``: demoted to host under
  write_through). The Full KV pool is rarely what evicts.
- Under write_through every inserted node is backed up at insert time with its state
  (``UnifiedTreeCore`` emits ``BackupKV``; ``UnifiedRadixCache._execute_and_commit_kv_backup``
  -> ``_execute_kv_backup`` -> controller ``write`` -> ``HostPoolGroup.resolve_host_transfers``
  takes one host mamba slot per state, reclaiming host LRU through ``evict_host(n, MAMBA)``).
  So the host mamba pool (``int(device_slots * ratio) + 1``) bounds how many states survive:
  41 at ratio 4. Observed, not traced to its line: in a 6-chunk prompt the first chunk's state
  is evicted from the device (alloc_req_slots' eviction of the 6th chunk) before any host copy
  of it exists, and its node's Full KV reaches the host without a state, so 5 states a 6,016-token
  prompt reach the host, not 6.
- Under write_back only evicted device *leaves* are backed up (``_evict_components``: deferred
  ``BackupKV``); chunk-end states on internal nodes are dropped with their device slot.

Per scenario (numbers pinned in ``tests/replay/test_tree_replay.py``):

- canary (shape-true rig): the second ask hits 3,072 on device and checkpoints 4,032; the 11
  fillers take every device state of P but none of its Full KV (the fill evicts 1 + 9 x 768
  tokens: the fillers' [2048, 2816) tails); host mamba holds 38 of 41 states, nothing reclaimed,
  no backup failed. The last ask matches 0 on device and 4,032 from host and loads back the
  4,032 state (mamba only; Full KV still on device). None of the candidate rules binds. With 672
  device tokens fewer (28,000) the fill evicts exactly the field's 7,936 tokens (P's tail
  [3072, 4095) too) and the last ask still loads 960 KV tokens + the state from host. So the
  field's zero host hits are NOT what this tree code does on this sequence with transfers that
  complete; the difference is outside what is replayed (see the report).
- bench (8 x 6,000 + 16, answers 8): chunk 1024: 8 of 8 prefixes from host, 5,120 tokens each
  (the last chunk end below 6,000; 5 states a prefix, 40 in 41 host slots); chunk 2048: 8 x
  4,096; chunk 8192: nothing (one chunk, its only state at 6,016, past the shared 6,000);
  ratio 1: nothing (11 host mamba slots and 28,673 host KV tokens reclaimed LRU); ratio 8: as
  ratio 4; write_back: nothing (internal chunk states dropped on device eviction). Never a
  device hit: 10 device slots cannot keep a prefix's states across 7 others.
- seed (210,000 KV, 16 mamba slots, ratio 1, chunk 2048; 8 x 18,000 + 16): nothing from either
  tier. 9 states a prefix (2,048 .. 16,384 and 17,984) for 16 device and 17 host slots: both
  tiers cycle LRU over the 8 prefixes and the second pass finds none of its states, while
  75,728 device KV tokens are free (Full KV never binds): each second-pass ask finds 16,384 or
  more tokens of its Full KV still on device (its ``mamba_branching_seqlen``) and no state on
  the path to start from, so it prefills from token 0. Sent at once (max_running 3) the same.
  The field's 5.2 s -> 1.6 s is not a prefix reuse of stock 0.5.19 under this model of the
  sequence.

Per release (read, not run; only 0.5.19 is installed): 0.5.21's ``unified_cache/components/
mamba.py: _evict_device_next_node`` returns an ``InternalStateBackup`` under write_back, so an
internal node's state is backed up to host before its device slot is freed; the write_back
variant's rule (chunk states dropped) is 0.5.19's. ``MAMBA_STATE_PER_REQ_PREFIX_CACHE`` is 3 in
0.5.19 and 0.5.21.

What runs for real (SGLang 0.5.19's code, unchanged):

- ``mem_cache/unified_radix_cache.py: UnifiedRadixCache`` with its real ``FullComponent`` and
  ``MambaComponent`` (``unified_cache/components/``) and the python ``UnifiedTreeCore`` (the
  default ``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND``), built as ``mem_cache/registry.py:
  _create_unified_radix_cache`` builds it (components FULL + MAMBA) and attached to HiCache by
  its own ``init_hicache`` -> ``hybrid_cache/hybrid_pool_assembler.py:
  attach_hybrid_pool_to_unified_cache`` -> ``_MambaStrategy.build`` -> ``build_hybrid_mamba_stack``;
- the device pools and allocators, on the CPU with tiny tensor shapes (1 KV head of dim 1, a
  1x3 conv state and a 1x1x1 SSM state, 3 GDN layers + 1 full-attention layer): 
  ``memory_pool.py: HybridReqToTokenPool`` (its ``MambaPool`` and ``allocator/mamba.py:
  MambaSlotAllocator``, extra_buffer ping-pong buffers of 2 as with the overlap scheduler),
  ``HybridLinearKVPool`` over ``MHATokenToKVPool``, ``allocator/token.py: TokenToKVPoolAllocator``
  (page size 1, ``need_sort`` False as ``kv_cache_configurator.py`` picks it);
- the host pools: ``pool_host/mha.py: MHATokenToKVPoolHost`` and ``pool_host/mamba.py:
  MambaPoolHost`` inside the real ``pool_host/group.py: HostPoolGroup`` (their own size rules:
  KV ``int(device_tokens * ratio)`` page-floored + 1 page; mamba ``int(device_slots * ratio)`` + 1),
  with their real free-list allocators;
- the request object: ``managers/schedule_batch.py: Req`` (``init_next_round_input`` ->
  ``match_prefix``, ``set_extend_range``, ``get_fill_ids``), the admission:
  ``managers/schedule_policy.py: PrefillAdder`` (``add_one_req`` with its ``init_load_back``,
  ``add_chunked_req``), and the allocation helpers ``mem_cache/allocation.py: alloc_req_slots``,
  ``alloc_token_slots`` (-> ``mem_cache/common.py: evict_from_tree_cache`` -> ``evict_for_alloc``),
  ``mem_cache/common.py: release_kv_cache`` (-> ``cache_finished_req``),
  ``maybe_cache_unfinished_req``.

Stand-ins (named; nothing else of SGLang is replaced):

- ``BookkeepingCacheController`` replaces ``hybrid_cache/hybrid_cache_controller.py:
  HybridCacheController`` (CUDA streams and copy kernels) by patching the name
  ``hybrid_pool_assembler.HybridCacheController`` that ``build_hybrid_mamba_stack`` calls. Its
  ``write`` is the real one's bookkeeping (``HostPoolGroup.alloc`` of the KV host indices, then
  ``HostPoolGroup.resolve_host_transfers`` for the mamba slot with the real host-eviction reclaim
  callback, freeing the KV indices if that fails) and completes at once: the ack is queued with a
  finished event, seen at the next ``writing_check``. Its ``load`` is the real one's (full
  allocator ``alloc``, then the real ``HybridCacheController._resolve_device_transfers`` for the
  mamba slot, with its device-eviction callback); ``start_loading`` (called through
  ``ready_to_load_host_cache`` as the scheduler does after building the batch) queues a finished
  ack, seen at the next ``loading_check``. No bytes move.
- ``_DoneEvent``: the CUDA event of an ack, always finished.
- host pool memory: ``pool_host/common.py: ALLOC_MEMORY_FUNCS`` answers a zero-stride view (no
  pinned allocation), the write-back staging buffers are skipped and ``host_memory_budget_bytes``
  answers "room for anything" (as ``scripts/sglang_oracle.py: stub_host_allocation``).
- ``torchvision``: a permissive empty package (the PyPI build cannot import on CPU torch).
- the runtime config: SGLang's own test hook ``runtime_context.get_context().override_server_args``
  publishes a dummy ``ServerArgs`` carrying the rig's flags, with ``_mamba_cache_chunk_size`` 64
  (FLA's chunk, what a Qwen3.5 config without ``mamba_chunk_size`` gives).
- the scheduler loop itself (``managers/scheduler.py``) is not run: ``Replay`` calls the cache in
  its order (below). The model forward is not run: a prefill chunk or a decode step is only its
  allocations and its bookkeeping; output tokens are distinct ids.

Order of calls per scheduler step (``Replay.step``), mirroring ``scheduler.py``:

1. ``get_next_batch_to_run``: a chunked request's previous chunk is stashed
   (``stash_chunked_request`` -> ``cache_unfinished_req(req, chunked=True)``);
2. ``_get_new_batch_prefill_raw``: ``tree_cache.check_hicache_events()`` (write/load acks);
   a chunked request continues (``init_next_round_input()`` without the tree, then
   ``PrefillAdder.add_chunked_req``), else the next waiting request is matched
   (``Req.init_next_round_input(tree_cache)``) and admitted (``PrefillAdder.add_one_req``: a host
   hit is loaded back there through ``init_load_back``), inside ``mamba_allocator.alloc_group_begin``
   / ``alloc_group_end``;
3. ``ScheduleBatch.init_new`` / ``ready_to_load_host_cache`` / ``prepare_for_extend``:
   ``alloc_for_extend`` (``alloc_req_slots``, ``alloc_token_slots``, the req_to_token writes of
   ``write_cache_indices``' CPU path, ``kv_allocated_len``/``kv_committed_len``) and the extra-buffer
   mamba tracking of ``ScheduleBatch._mamba_radix_cache_v2_req_prepare_for_extend``
   (``mamba_last_track_seqlen = len(prefix) + (extend_len // grid) * grid`` when the extend is at
   least one grid, ``mamba_branching_seqlen`` honoured, ping-pong index swapped);
4. ``batch_result_processor.py: process_batch_result_prefill``: after the last chunk the first
   output token is appended and, the request not finished, ``maybe_cache_unfinished_req``;
5. decode steps (``alloc_for_decode``: one ``alloc_token_slots`` per token) until the answer has
   its length, then ``release_kv_cache`` -> ``cache_finished_req``. Decode crosses no mamba track
   boundary in these scenarios (``mamba_track_interval`` 256; asserted), so no decode checkpoint.

``Replay.run`` serves requests one at a time (the next arrives after the previous finished);
``Replay.run_many`` serves a list that arrives at once (bench/seed ``--at-once``), with
``max_running_requests`` and the scheduler's ``get_num_allocatable_reqs`` (min of running
headroom and free req rows) deciding who joins a prefill batch, one prefill or one decode batch
per step (no mixed chunks). Either way the non-overlap order of steps is used (the overlap
scheduler's one-step-late result processing is not modelled; its two ping-pong track slots are).

Usage: ``python tests/replay/sglang_tree_replay.py SCENARIO [--chunk N] [--ratio R] [--policy P]
[--json]`` with SCENARIO one of canary, bench, seed, all (all: every scenario and variant the
tests pin, one import). Runs with the flag-catalog venv's Python (``.cache/flagcat-venv``, or
``$ESCHA_FLAGCAT_VENV``): sglang 0.5.19, CPU torch.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import time
import types
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

# --------------------------------------------------------------------------- stand-ins: import


def install_torchvision_stand_in() -> None:
    """The oracle's permissive ``torchvision`` stand-in (``scripts/sglang_oracle.py``: the PyPI
    build does not import against the CPU torch), first on ``sys.meta_path``."""
    scripts = str(Path(__file__).resolve().parents[2] / "scripts")
    if scripts not in sys.path:
        sys.path.insert(0, scripts)
    import sglang_oracle

    sglang_oracle.install_torchvision_stand_in()


# --------------------------------------------------------------------------- rig


@dataclass
class Rig:
    """One box per rank, as SGLang is launched on it."""

    kv_tokens: int
    mamba_slots: int
    ratio: float
    chunk: int
    policy: str = "write_through"
    page_size: int = 1
    max_running: int = 2
    name: str = ""
    #: patch 0004 (``ESCHA_HICACHE_HOST_MAMBA_SLOTS``): the host mamba pool's state count in place
    #: of ``int(mamba_slots * ratio)``; None = stock
    host_mamba_slots: Optional[int] = None

    def flags(self) -> dict[str, Any]:
        return dict(
            page_size=self.page_size, enable_hierarchical_cache=True, hicache_ratio=float(self.ratio),
            hicache_write_policy=self.policy, hicache_io_backend="kernel", hicache_mem_layout="page_first",
            mamba_radix_cache_strategy="extra_buffer", max_mamba_cache_size=self.mamba_slots,
            chunked_prefill_size=self.chunk, max_running_requests=self.max_running,
            max_total_tokens=self.kv_tokens, _mamba_cache_chunk_size=64,
        )


SHAPE_TRUE = dict(kv_tokens=28_672, mamba_slots=10, ratio=4, chunk=1024, max_running=2)
SEED = dict(kv_tokens=210_000, mamba_slots=16, ratio=1, chunk=2048, max_running=3)

# --------------------------------------------------------------------------- stand-in controller


class _DoneEvent:
    """Stand-in for an ack's CUDA event: the transfer it marks has completed."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None

    def record(self, *_a: Any) -> None:
        return None

    def elapsed_time(self, _other: Any) -> float:
        return 0.0


def _make_controller_class():
    import torch
    from sglang.srt.managers.cache_controller import HiCacheAck
    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController

    class BookkeepingCacheController:
        """Stand-in for ``HybridCacheController``: its host/device index bookkeeping, transfers
        completed at once (see the module docstring)."""

        _resolve_device_transfers = HybridCacheController._resolve_device_transfers

        def __init__(self, token_to_kv_pool_allocator, mem_pool_host, page_size, tp_group, *,
                     write_policy="write_through_selective", transfer_layer_num=None, **_kw):
            self.mem_pool_device_allocator = token_to_kv_pool_allocator
            self.mem_pool_host = mem_pool_host
            self.page_size = page_size
            self.write_policy = write_policy
            self.device = "cpu"
            self.enable_storage = False
            self.storage_backend = None
            self.extra_host_mem_release_queues = {}
            self.layer_num = transfer_layer_num
            self.layer_done_counter = types.SimpleNamespace(
                events=[types.SimpleNamespace(finish_event=_DoneEvent())] * 3, reset=lambda: None,
                set_consumer=lambda i: None, wait_until=lambda t: None)
            self.ack_write_queue: list = []
            self.ack_load_queue: list = []
            self.load_queue: list = []
            self.writes = self.loads = 0
            self.loaded_kv_tokens = 0
            self.loaded_mamba_slots = 0
            self.write_failures = 0

        def reset(self):
            self.ack_write_queue.clear()
            self.ack_load_queue.clear()
            self.load_queue.clear()

        def _ack(self, node_ids, n):
            return HiCacheAck(start_event=_DoneEvent(), finish_event=_DoneEvent(), node_ids=list(node_ids),
                              num_tokens=n)

        # HybridCacheController.write, the D->H copy completed at once
        def write(self, device_indices, priority=None, node_id=-1, extra_pools=None):
            host_indices = self.mem_pool_host.alloc(len(device_indices))
            if host_indices is None:
                self.write_failures += 1
                return None
            pool_transfers = self.mem_pool_host.resolve_host_transfers(
                extra_pools, primary_device_indices=device_indices, primary_host_indices=host_indices)
            if pool_transfers is None and extra_pools:
                self.mem_pool_host.free(host_indices)
                self.write_failures += 1
                return None
            self.writes += 1
            TOTALS["writes"] += 1
            self.ack_write_queue.append(self._ack([node_id], len(device_indices)))
            return host_indices

        # HybridCacheController.load, the H->D copy queued for start_loading
        def load(self, host_indices, priority=None, node_id=-1, extra_pools=None):
            need_load_kv = host_indices.numel() > 0
            full_allocator = getattr(self.mem_pool_device_allocator, "full_attn_allocator",
                                     self.mem_pool_device_allocator)
            if not need_load_kv:
                device_indices = torch.empty((0,), dtype=torch.int64)
            else:
                device_indices = full_allocator.alloc(len(host_indices))
                if device_indices is None:
                    return None
            pool_transfers = self._resolve_device_transfers(
                extra_pools, kv_device_indices=device_indices, kv_host_indices=host_indices)
            if pool_transfers is None and extra_pools:
                if need_load_kv:
                    full_allocator.free(device_indices)
                return None
            self.loads += 1
            self.loaded_kv_tokens += len(host_indices)
            self.loaded_mamba_slots += sum(len(t.host_indices) for t in extra_pools or []
                                           if t.host_indices is not None and t.device_indices is not None)
            self.load_queue.append((node_id, len(host_indices)))
            return device_indices

        def start_loading(self) -> int:
            if not self.load_queue:
                return -1
            ids = [n for n, _ in self.load_queue]
            self.ack_load_queue.append(self._ack(ids, sum(k for _, k in self.load_queue)))
            self.load_queue.clear()
            return 0

        def append_host_mem_release(self, *a, **k):  # storage (L3) only
            raise RuntimeError("BookkeepingCacheController: no storage backend in the replay")

    return BookkeepingCacheController


def _no_staging(self, *_a: Any, **_k: Any) -> None:
    """The write-back JIT staging buffers are device-side: none on the CPU."""
    self.can_use_write_back_jit = False


def _stub_host_allocation() -> None:
    """Host pools: size arithmetic unchanged, no (pinned) allocation of their bytes."""
    import torch
    from sglang.srt.mem_cache.pool_host import base, common, mamba, mha

    def no_allocation(dims, dtype, device, pin_memory, allocator, registration_granularity_bytes=None):
        return torch.empty(1, dtype=dtype).expand(*dims)

    common.ALLOC_MEMORY_FUNCS.default_factory = lambda: no_allocation
    common.ALLOC_MEMORY_FUNCS.clear()
    for cls in (mha.MHATokenToKVPoolHost, mamba.MambaPoolHost):
        cls._init_write_back_staging_buffers = _no_staging
    for mod in (base, mha, mamba):
        mod.host_memory_budget_bytes = lambda *_a, **_k: 1 << 62


_PREPARED = False
#: Across every box of one process: the D->H writes the stand-in controller completed (what
#: ``tests/gpu_rig/tier_trace`` should count as successful backups when it wraps this run).
TOTALS = {"writes": 0}


def prepare() -> None:
    """Import SGLang once (about 20 s) and install the stand-ins."""
    global _PREPARED
    if _PREPARED:
        return
    install_torchvision_stand_in()
    logging.disable(logging.WARNING)
    import warnings

    warnings.filterwarnings("ignore")
    import sglang.srt.mem_cache.unified_radix_cache  # noqa: F401
    from sglang.srt.mem_cache.hybrid_cache import hybrid_pool_assembler

    _stub_host_allocation()
    hybrid_pool_assembler.HybridCacheController = _make_controller_class()
    _PREPARED = True


@contextlib.contextmanager
def _host_mamba_slots(slots: Optional[int]):
    """Patch 0004's size rule on the stock tree (stand-in, named): while the hybrid stack is
    built, ``MambaPoolHost`` gets the ratio ``(slots + 0.5) / device_slots``, so its own
    ``int(device_pool.size * host_to_device_ratio)`` is ``slots``, as the patched constructor's
    ``escha_host_mamba_slots.host_mamba_size`` makes it; the host KV pool keeps the rig's ratio."""
    if slots is None:
        yield
        return
    from sglang.srt.mem_cache.pool_host import mamba

    original = mamba.MambaPoolHost.__init__

    def sized(self, device_pool, host_to_device_ratio, *a, **k):
        original(self, device_pool, (slots + 0.5) / device_pool.size, *a, **k)

    mamba.MambaPoolHost.__init__ = sized
    try:
        yield
    finally:
        mamba.MambaPoolHost.__init__ = original


# --------------------------------------------------------------------------- the box


class Box:
    """SGLang's pools and tree cache for one rig, built as the scheduler builds them."""

    def __init__(self, rig: Rig):
        prepare()
        import torch
        from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape
        from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.memory_pool import HybridLinearKVPool, HybridReqToTokenPool
        from sglang.srt.mem_cache.unified_cache.components import ComponentType
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
        from sglang.srt.runtime_context import get_context, get_memory

        self.rig = rig
        self._override = get_context().override_server_args(**rig.flags())
        self.server_args = self._override.install()
        shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=1, n_groups=1, num_heads=1, head_dim=1,
                                        state_size=1, conv_kernel=2)
        cache_params = Mamba2CacheParams(shape=shape, layers=[0, 1, 2])
        self.req_to_token_pool = HybridReqToTokenPool(
            size=rig.max_running, mamba_size=rig.mamba_slots, mamba_spec_state_size=rig.max_running,
            max_context_len=65_536, device="cpu", enable_memory_saver=False, cache_params=cache_params,
            mamba_layer_ids=[0, 1, 2], enable_mamba_extra_buffer=True, enable_overlap_schedule=True)
        self.kv_pool = HybridLinearKVPool(
            size=rig.kv_tokens, dtype=torch.bfloat16, page_size=rig.page_size, head_num=1, head_dim=1,
            full_attention_layer_ids=[3], device="cpu", mamba_pool=self.req_to_token_pool.mamba_pool)
        self.allocator = TokenToKVPoolAllocator(rig.kv_tokens, dtype=torch.bfloat16, device="cpu",
                                                kvcache=self.kv_pool, need_sort=False)
        params = CacheInitParams(
            disable=False, req_to_token_pool=self.req_to_token_pool, token_to_kv_pool_allocator=self.allocator,
            page_size=rig.page_size, enable_mamba_extra_buffer=True, chunked_prefill_size=rig.chunk,
            eviction_policy=get_memory().radix_eviction_policy,
            tree_components=(ComponentType.FULL, ComponentType.MAMBA))
        self.cache = UnifiedRadixCache(params)
        with _host_mamba_slots(rig.host_mamba_slots):
            self.cache.init_hicache(self.server_args, params)
        self.controller = self.cache.cache_controller
        from sglang.srt.mem_cache.hicache_storage import PoolName

        self.host_kv = self.cache.host_pool_group.get_pool(PoolName.KV)
        self.host_mamba = self.cache.host_pool_group.get_pool(PoolName.MAMBA)

    def close(self) -> None:
        self._override.restore()

    def sizes(self) -> dict[str, int]:
        return {"device_kv": int(self.allocator.size), "device_mamba": int(self.req_to_token_pool.mamba_pool.size),
                "host_kv": int(self.host_kv.size), "host_mamba": int(self.host_mamba.size)}


# --------------------------------------------------------------------------- the scheduler's order


@dataclass
class Ask:
    label: str
    ids: list[int]
    answer: int
    out: dict[str, Any] = field(default_factory=dict)


class Replay:
    """Drive one Box through asks, one request at a time, in the scheduler's order."""

    def __init__(self, box: Box):
        self.box = box
        self.cache = box.cache
        self.next_token = 10_000_000
        self.rid = 0
        self.mamba_evicted = 0
        self.kv_evicted = 0
        self.host_evicted = {"kv": 0, "mamba": 0}
        self._count_evictions()

    def _count_evictions(self) -> None:
        cache = self.cache
        original = cache._evict

        def counting(params, available_size_targets=None):
            res = original(params, available_size_targets)
            self.kv_evicted += res.num_tokens_evicted
            self.mamba_evicted += res.mamba_num_evicted
            return res

        cache._evict = counting
        original_host = cache.evict_host

        def counting_host(num_tokens, component_type=None):
            from sglang.srt.mem_cache.unified_cache.components import ComponentType

            ct = ComponentType.FULL if component_type is None else component_type
            freed = original_host(num_tokens, ct)
            self.host_evicted["mamba" if ct == ComponentType.MAMBA else "kv"] += freed
            return freed

        cache.evict_host = counting_host

    def _new_req(self, ids: list[int], answer: int):
        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.sampling.sampling_params import SamplingParams

        self.rid += 1
        sp = SamplingParams(max_new_tokens=answer, ignore_eos=False)
        return Req(f"r{self.rid}", "", array("q", ids), sp)

    def _adder(self):
        from sglang.srt.managers.schedule_policy import PrefillAdder

        running = types.SimpleNamespace(reqs=[], batch_size=lambda: 0)
        return PrefillAdder(self.box.rig.page_size, self.cache, self.box.allocator, running, 0.7, 16_384,
                            self.box.rig.chunk, 0, max_running_requests=self.box.rig.max_running)

    def _extend(self, req) -> None:
        """prepare_for_extend: alloc_for_extend + the extra-buffer mamba tracking."""
        import torch
        from sglang.srt.mem_cache.allocation import alloc_req_slots, alloc_token_slots
        from sglang.srt.runtime_context import mamba_checkpoint_grid

        box = self.box
        pre_len = len(req.prefix_indices)
        ext = req.extend_range.length
        seq_len = pre_len + ext
        idx = alloc_req_slots(box.req_to_token_pool, [req], self.cache)
        out = alloc_token_slots(self.cache, ext)
        row = idx[0]
        box.req_to_token_pool.write((row, slice(0, pre_len)), req.prefix_indices)
        box.req_to_token_pool.write((row, slice(pre_len, seq_len)), out.to(torch.int32))
        req.kv.kv_allocated_len = seq_len
        req.kv.kv_committed_len = seq_len
        # ScheduleBatch._mamba_radix_cache_v2_req_prepare_for_extend (extra_buffer, not lazy)
        grid = mamba_checkpoint_grid(box.rig.page_size)
        if ext >= grid:
            aligned = pre_len + (ext // grid) * grid
            req.kv.mamba_last_track_idx = req.kv.mamba_next_track_idx
            req.kv.mamba_next_track_idx = box.req_to_token_pool.get_mamba_ping_pong_other_idx(
                req.kv.mamba_next_track_idx)
            b = req.mamba_branching_seqlen
            if b is not None and pre_len < b < seq_len and (b - pre_len) % grid == 0:
                aligned = b
            req.kv.mamba_last_track_seqlen = aligned

    def _token(self) -> int:
        self.next_token += 1
        return self.next_token

    def run(self, ask: Ask) -> dict[str, Any]:
        """One request from arrival to finish; what its first match found."""
        from sglang.srt.managers.schedule_batch import FINISH_LENGTH
        from sglang.srt.managers.schedule_policy import AddReqResult
        from sglang.srt.mem_cache.common import maybe_cache_unfinished_req, release_kv_cache

        cache = self.cache
        box = self.box
        req = self._new_req(ask.ids, ask.answer)
        mamba_alloc = box.req_to_token_pool.mamba_allocator
        first = True
        chunked = False
        loads_before = box.controller.loads
        kv_before, mamba_before = box.controller.loaded_kv_tokens, box.controller.loaded_mamba_slots
        ev0 = (self.kv_evicted, self.mamba_evicted)
        while True:
            if chunked:  # get_next_batch_to_run: stash the previous chunk
                maybe_cache_unfinished_req(req, cache, chunked=True)
            cache.check_hicache_events()
            adder = self._adder()
            mamba_alloc.alloc_group_begin(0 if chunked else 1)
            if chunked:
                req.init_next_round_input()
                new_chunked = adder.add_chunked_req(req)
                res = AddReqResult.CONTINUE
            else:
                req.init_next_round_input(cache)
                if first:
                    ask.out.update(device_hit=len(req.prefix_indices), host_hit=int(req.host_hit_length),
                                   mamba_host_hit=int(req.mamba_host_hit_length),
                                   branching=req.mamba_branching_seqlen)
                res = adder.add_one_req(req, has_chunked_req=False, truncation_align_size=None)
                new_chunked = adder.new_chunked_req
                if first:
                    ask.out["prefix_after_load_back"] = len(req.prefix_indices)
                    first = False
            mamba_alloc.alloc_group_end()
            if req not in adder.can_run_list:
                raise RuntimeError(f"{ask.label}: not admitted ({res}); the replay runs one request at a time")
            cache.ready_to_load_host_cache()
            self._extend(req)
            chunked = new_chunked is not None
            if not chunked:
                break
        # last chunk done: process_batch_result_prefill
        req.output_ids.append(self._token())
        if len(req.output_ids) >= ask.answer:
            req.finished_reason = FINISH_LENGTH(length=ask.answer)
        if not req.finished():
            maybe_cache_unfinished_req(req, cache)
        # decode
        interval = 256
        while not req.finished():
            cache.check_hicache_events()
            seq = req.kv.kv_committed_len
            assert (seq + 1) % interval != 0, "decode would cross a mamba track boundary (not modelled)"
            from sglang.srt.mem_cache.allocation import alloc_token_slots
            import torch

            loc = alloc_token_slots(cache, 1)
            box.req_to_token_pool.write((req.kv.req_pool_idx, seq), loc.to(torch.int32))
            req.kv.kv_allocated_len += 1
            req.kv.kv_committed_len += 1
            req.output_ids.append(self._token())
            if len(req.output_ids) >= ask.answer:
                req.finished_reason = FINISH_LENGTH(length=ask.answer)
        release_kv_cache(req, cache)
        cache.check_hicache_events()
        ask.out.update(loaded_back=box.controller.loads - loads_before,
                       loaded_kv_tokens=box.controller.loaded_kv_tokens - kv_before,
                       loaded_mamba_slots=box.controller.loaded_mamba_slots - mamba_before,
                       kv_evicted=self.kv_evicted - ev0[0], mamba_evicted=self.mamba_evicted - ev0[1])
        return ask.out

    def run_many(self, asks: list[Ask]) -> None:
        """Asks that all arrive at once, served as the scheduler serves them without mixed chunks:
        each step a prefill batch if ``PrefillAdder`` admits one (the in-flight chunked request
        first, then waiting requests while ``get_num_allocatable_reqs`` = min(max_running -
        decoding, free req rows) allows), else one decode step of every running request."""
        import torch
        from sglang.srt.managers.schedule_batch import FINISH_LENGTH
        from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder
        from sglang.srt.mem_cache.allocation import alloc_token_slots
        from sglang.srt.mem_cache.common import maybe_cache_unfinished_req, release_kv_cache

        cache, box = self.cache, self.box
        pool = box.req_to_token_pool
        waiting = [(a, self._new_req(a.ids, a.answer)) for a in asks]
        of = {id(r): a for a, r in waiting}
        running: list = []
        chunked = None
        loads = {}
        while waiting or running or chunked is not None:
            if chunked is not None:
                maybe_cache_unfinished_req(chunked, cache, chunked=True)
            cache.check_hicache_events()
            rb = types.SimpleNamespace(reqs=list(running), batch_size=lambda: len(running))
            adder = PrefillAdder(box.rig.page_size, cache, box.allocator, rb, 0.7, 16_384, box.rig.chunk, 0,
                                 max_running_requests=box.rig.max_running)
            if chunked is not None:
                chunked.init_next_round_input()
                chunked = adder.add_chunked_req(chunked)
            pool.mamba_allocator.alloc_group_begin(len(waiting))
            for a, req in list(waiting):
                allocatable = min(box.rig.max_running - len(running), pool.available_size())
                if len(adder.can_run_list) >= allocatable:
                    break
                cc = box.controller
                before = cc.loads, cc.loaded_kv_tokens, cc.loaded_mamba_slots
                req.init_next_round_input(cache)
                a.out.update(device_hit=len(req.prefix_indices), host_hit=int(req.host_hit_length),
                             mamba_host_hit=int(req.mamba_host_hit_length), branching=req.mamba_branching_seqlen)
                res = adder.add_one_req(req, has_chunked_req=chunked is not None, truncation_align_size=None)
                added = bool(adder.can_run_list) and adder.can_run_list[-1] is req
                if added:
                    a.out["prefix_after_load_back"] = len(req.prefix_indices)
                    loads[id(req)] = (cc.loads - before[0], cc.loaded_kv_tokens - before[1],
                                      cc.loaded_mamba_slots - before[2])
                if res != AddReqResult.CONTINUE:
                    if not added:
                        req.kv.mamba_cow_src_index = None
                        req.kv.mamba_needs_clear = False
                        if req.kv.holds_mamba:
                            pool.mamba_allocator.free(req.kv.mamba_pool_idx.unsqueeze(-1))
                            req.kv.mamba_pool_idx = None
                    break
            pool.mamba_allocator.alloc_group_end()
            batch = adder.can_run_list
            if batch:
                waiting = [(a, r) for a, r in waiting if r not in batch]
                if adder.new_chunked_req is not None:
                    chunked = adder.new_chunked_req
                cache.ready_to_load_host_cache()
                for req in batch:
                    self._extend(req)
                for req in batch:
                    if req is chunked:
                        continue
                    req.output_ids.append(self._token())
                    if len(req.output_ids) >= req.sampling_params.max_new_tokens:
                        req.finished_reason = FINISH_LENGTH(length=req.sampling_params.max_new_tokens)
                        release_kv_cache(req, cache)
                    else:
                        maybe_cache_unfinished_req(req, cache)
                        running.append(req)
                continue
            if not running:
                continue
            locs = alloc_token_slots(cache, len(running))
            for i, req in enumerate(list(running)):
                seq = req.kv.kv_committed_len
                assert (seq + 1) % 256 != 0, "decode would cross a mamba track boundary (not modelled)"
                pool.write((req.kv.req_pool_idx, seq), locs[i:i + 1].to(torch.int32))
                req.kv.kv_allocated_len += 1
                req.kv.kv_committed_len += 1
                req.output_ids.append(self._token())
                if len(req.output_ids) >= req.sampling_params.max_new_tokens:
                    req.finished_reason = FINISH_LENGTH(length=req.sampling_params.max_new_tokens)
                    release_kv_cache(req, cache)
                    running.remove(req)
        cache.check_hicache_events()
        for rid, (n, kv, mamba) in loads.items():
            of[rid].out.update(loaded_back=n, loaded_kv_tokens=kv, loaded_mamba_slots=mamba)

    @staticmethod
    def _where(cd) -> str:
        return ("D" if cd.value is not None else "-") + ("H" if cd.host_value is not None else "-")

    def tree(self) -> list[str]:
        """The radix tree, one line a node: token span from the root, where Full KV and the
        mamba state live (D device, H host, - none)."""
        from sglang.srt.mem_cache.unified_cache.components import ComponentType

        core = self.cache.tree_core
        lines = []
        stack = [(core.root_node, 0, 0)]
        while stack:
            node, depth, indent = stack.pop()
            end = depth + (len(node.key) if node.key is not None else 0)
            if node is not core.root_node:
                f = node.component_data[ComponentType.FULL]
                m = node.component_data[ComponentType.MAMBA]
                lines.append(f"{' ' * indent}[{depth},{end}) kv={self._where(f)} mamba={self._where(m)} lock={f.lock_ref}")
            for child in sorted(node.children.values(), key=lambda c: -c.id):
                stack.append((child, end, indent + 1))
        return lines

    def state(self) -> dict[str, int]:
        box = self.box
        return {"device_kv_free": int(box.allocator.available_size()),
                "device_mamba_free": int(box.req_to_token_pool.mamba_allocator.available_size()),
                "host_kv_free": int(box.host_kv.available_size()),
                "host_mamba_free": int(box.host_mamba.available_size()),
                "backups": box.controller.writes, "backup_failures": box.controller.write_failures,
                "host_evicted_kv": self.host_evicted["kv"], "host_evicted_mamba": self.host_evicted["mamba"]}


# --------------------------------------------------------------------------- scenarios


class Tokens:
    """Distinct token ids for distinct texts."""

    def __init__(self) -> None:
        self.n = 1000

    def take(self, k: int) -> list[int]:
        out = list(range(self.n, self.n + k))
        self.n += k
        return out


def canary(rig: Rig, filler_answer: int = 32, shared: int = 0) -> dict[str, Any]:
    box = Box(rig)
    rp = Replay(box)
    tok = Tokens()
    head = list(range(1, shared + 1))  # tokens every prompt starts with (a ledger's "Entry")
    p = head + tok.take(4096 - shared)
    asks = [Ask("P", p, 32), Ask("P again", p, 32)]
    asks += [Ask(f"filler {i + 1}", head + tok.take(2868 - shared), filler_answer) for i in range(11)]
    asks.append(Ask("P last", p, 32))
    for a in asks[:-1]:
        rp.run(a)
    tree_before_last = rp.tree()
    state_before_last = rp.state()
    rp.run(asks[-1])
    out = {"rig": rig.__dict__, "sizes": box.sizes(), "asks": [{"label": a.label, **a.out} for a in asks],
           "state_before_last": state_before_last, "state": rp.state(),
           "tree_before_last": tree_before_last[:6]}
    last = asks[-1].out
    out["answer"] = {"device_hit": last["device_hit"], "host_hit": last["host_hit"],
                     "prefix_after_load_back": last["prefix_after_load_back"],
                     "loaded_kv_tokens": last["loaded_kv_tokens"], "loaded_mamba_slots": last["loaded_mamba_slots"],
                     "evicted_during_fill": sum(a.out["kv_evicted"] for a in asks[2:-1])}
    box.close()
    return out


def bench(rig: Rig, n: int = 8, prefix: int = 6000, at_once: bool = False) -> dict[str, Any]:
    box = Box(rig)
    rp = Replay(box)
    tok = Tokens()
    prefixes = [tok.take(prefix) for _ in range(n)]
    first = [Ask(f"first {i}", prefixes[i] + tok.take(16), 8) for i in range(n)]
    second = [Ask(f"second {i}", prefixes[i] + tok.take(16), 8) for i in range(n)]
    if at_once:  # each pass sent at once, as scripts/gpu_tier_variants.py's bench sends it
        rp.run_many(first)
        rp.run_many(second)
    else:
        for a in first + second:
            rp.run(a)
    out = {"rig": rig.__dict__, "sizes": box.sizes(),
           "asks": [{"label": a.label, **a.out} for a in first + second], "state": rp.state()}
    out["answer"] = {
        "second_pass_host_hits": sum(1 for a in second if a.out["host_hit"] > 0),
        "second_pass_host_tokens": sum(a.out["host_hit"] for a in second),
        "second_pass_device_hits": sum(1 for a in second if a.out["device_hit"] > 0),
        "second_pass_device_tokens": sum(a.out["device_hit"] for a in second),
        "second_pass_reused_tokens": sum(a.out["prefix_after_load_back"] for a in second),
        "second_pass_loaded_kv_tokens": sum(a.out["loaded_kv_tokens"] for a in second),
        "second_pass_loaded_mamba_slots": sum(a.out["loaded_mamba_slots"] for a in second),
    }
    box.close()
    return out


def _rig(base: dict, args: argparse.Namespace, name: str) -> Rig:
    kw = dict(base)
    for key in ("chunk", "ratio", "policy", "kv_tokens", "mamba_slots", "host_mamba_slots"):
        if getattr(args, key):
            kw[key] = getattr(args, key)
    return Rig(name=name, **kw)


#: The variants the tests pin (scenario "all"): name, scenario, rig, scenario options.
VARIANTS: list[tuple[str, str, dict, dict]] = [
    ("canary", "canary", dict(SHAPE_TRUE), {}),
    # as escha_deploy/bench/canary.py sends them: each filler asked for 1 token
    ("canary fillers 1 token", "canary", dict(SHAPE_TRUE), dict(filler_answer=1)),
    # 672 device tokens fewer: the fill then evicts exactly the field's 7,936 tokens per rank
    ("canary device 28000", "canary", dict(SHAPE_TRUE, kv_tokens=28_000), dict(filler_answer=1)),
    ("bench", "bench", dict(SHAPE_TRUE), {}),
    ("bench chunk 2048", "bench", dict(SHAPE_TRUE, chunk=2048), {}),
    ("bench chunk 8192", "bench", dict(SHAPE_TRUE, chunk=8192), {}),
    ("bench ratio 1", "bench", dict(SHAPE_TRUE, ratio=1), {}),
    ("bench ratio 8", "bench", dict(SHAPE_TRUE, ratio=8), {}),
    ("bench write_back", "bench", dict(SHAPE_TRUE, policy="write_back"), {}),
    ("seed", "seed", dict(SEED), {}),
    # each pass's 8 requests sent at once (max_running 2 / 3), as the tier bench sends them
    ("bench at once", "bench", dict(SHAPE_TRUE), dict(at_once=True)),
    ("seed at once", "seed", dict(SEED), dict(at_once=True)),
    # patch 0004: host mamba states apart from the ratio (planner/reach.py predicts each)
    ("bench ratio 2 host mamba 56", "bench", dict(SHAPE_TRUE, ratio=2, host_mamba_slots=56), {}),
    ("bench ratio 2 host mamba 48", "bench", dict(SHAPE_TRUE, ratio=2, host_mamba_slots=48), {}),
    ("bench ratio 1 host mamba 48", "bench", dict(SHAPE_TRUE, ratio=1, host_mamba_slots=48), {}),
    ("seed host mamba 80", "seed", dict(SEED, host_mamba_slots=80), {}),
    ("seed ratio 4", "seed", dict(SEED, ratio=4), {}),
    ("bench ratio 2 host mamba 56 at once", "bench", dict(SHAPE_TRUE, ratio=2, host_mamba_slots=56),
     dict(at_once=True)),
    ("seed host mamba 80 at once", "seed", dict(SEED, host_mamba_slots=80), dict(at_once=True)),
]


def run_scenario(kind: str, rig: Rig, **kw: Any) -> dict[str, Any]:
    if kind == "canary":
        return canary(rig, **kw)
    if kind == "bench":
        return bench(rig, **kw)
    if kind == "seed":
        return bench(rig, prefix=18_000, **kw)
    raise ValueError(kind)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenario", choices=["canary", "bench", "seed", "all"])
    ap.add_argument("--chunk", type=int)
    ap.add_argument("--ratio", type=float)
    ap.add_argument("--policy", choices=["write_through", "write_back", "write_through_selective"])
    ap.add_argument("--kv-tokens", type=int, help="device KV pool tokens")
    ap.add_argument("--mamba-slots", type=int, help="device mamba slots (--max-mamba-cache-size)")
    ap.add_argument("--host-mamba-slots", type=int,
                    help="patch 0004's ESCHA_HICACHE_HOST_MAMBA_SLOTS: host mamba states in place of slots x ratio")
    ap.add_argument("--filler-answer", type=int, help="canary: tokens each filler asks for (default 32)")
    ap.add_argument("--at-once", action="store_true", help="bench/seed: each pass's requests arrive together")
    ap.add_argument("--json", action="store_true", help="the whole record as JSON (default: the answers)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    prepare()
    t1 = time.perf_counter()
    results: dict[str, Any] = {}
    if args.scenario == "all":
        for name, kind, base, kw in VARIANTS:
            results[name] = run_scenario(kind, Rig(name=name, **base), **kw)
    else:
        base = SEED if args.scenario == "seed" else SHAPE_TRUE
        kw = {"filler_answer": args.filler_answer} if args.scenario == "canary" and args.filler_answer else {}
        if args.at_once and args.scenario != "canary":
            kw["at_once"] = True
        results[args.scenario] = run_scenario(args.scenario, _rig(base, args, args.scenario), **kw)
    t2 = time.perf_counter()
    doc = {"import_s": round(t1 - t0, 1), "replay_s": round(t2 - t1, 1), "results": results,
           "totals": dict(TOTALS)}
    if args.json:
        print(json.dumps(doc, indent=1, default=str))
    else:
        for name, r in results.items():
            print(f"{name}: sizes {r['sizes']} answer {r['answer']} state {r['state']}")
        print(f"import {doc['import_s']} s, replay {doc['replay_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
