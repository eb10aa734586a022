"""Renders the SGLang server's flags and the environment the runtime reads, from a plan.

``server_args(plan, profile)`` renders the flag list that follows ``python -m
sglang.launch_server``; ``server_env(plan, profile)`` the environment variables (our patches',
INT2's, NCCL's, the L3 file backend's). A flag or variable that a profile key feeds is spelled
once, in that key's ``SGLangFlag`` metadata (``profile/models.py``), and looked up here by the
key (``key_flag``, ``key_env``); this module spells only what no key declares: the values the
plan and the launch derive (``--host``, the multi-node flags, ``--config``, the register chunk,
``NO_PROXY``). ``tests/test_flags_once.py`` fails on a second spelling. Flag spellings are SGLang
0.5.19's (checked against the flag catalog generated from its real parser,
``escha_deploy/catalog/``, by ``tests/test_flags.py``); flags that a capability adds
(``int2-kv``) are declared in ``capabilities.py``. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from escha_deploy.sglang.capabilities import ENV_HOST_ALLOCATOR, ENV_HOST_MAMBA_SLOTS, ENV_HOST_RESERVE
from escha_deploy.planner.result import Plan
from escha_deploy.profile import L3Mooncake, Profile, key_env, key_flag

#: Where the L3 file store lives inside the container; the host folder is bind-mounted here.
CONTAINER_L3_DIR = "/var/lib/escha/hicache"
#: Loopback names a proxy must never see: SGLang's warmup request goes to the server's own
#: --host (0.0.0.0 in a container) through any http_proxy it inherits (sglang#9814).
NO_PROXY = "localhost,127.0.0.1,0.0.0.0,::1"
#: SGLang's cap on one cudaHostRegister call, in GiB despite its name (``srt/environ.py``:
#: ``SGLANG_HICACHE_HOST_REGISTER_CHUNK_GB = EnvInt(256)``; ``pool_host/common.py:
#: _cuda_host_register`` multiplies it by 1024**3), in 0.5.19 and 0.5.23 alike.
ENV_REGISTER_CHUNK = "SGLANG_HICACHE_HOST_REGISTER_CHUNK_GB"
#: The chunk ``server_env`` sets, and the buffer size above which it sets it: 16 GiB, half of the
#: one call that failed with rc=1 although memlock was unlimited (34,760,392,704 B, a 32 GiB
#: pool; sglang PR #39744, whose fix halves a failing chunk and retries). The default (256 GiB)
#: registers any buffer of these profiles in one call; ``linux-tp2-l3`` registers a 21.3 GB KV
#: buffer per rank.
REGISTER_CHUNK_GIB = 16


def merged_no_proxy(environ: Mapping[str, str]) -> str:
    """``no_proxy`` for a server that inherits ``environ``: the user's own entries (from
    ``no_proxy`` and ``NO_PROXY``, in that order, without repeats) followed by the loopback
    names of ``NO_PROXY`` they lack, comma-separated. Keeping the user's entries keeps their
    internal hosts (a model mirror, an L3 store) off the proxy; the loopback ones are what
    SGLang's own warmup needs (sglang#9814)."""
    entries: list[str] = []
    for var in ("no_proxy", "NO_PROXY"):
        entries += [e.strip() for e in (environ.get(var) or "").split(",") if e.strip()]
    entries += NO_PROXY.split(",")
    return ",".join(dict.fromkeys(entries))


def _fmt_float(x: float) -> str:
    return f"{x:g}"


@dataclass(frozen=True)
class MultiNode:
    """One node of a multi-node instance, as ``server_args`` renders it: ``tp_size`` is the
    instance's total TP (SGLang's ``--tp-size`` counts every node's GPUs,
    ``docs/references/multi_node_deployment/multi_node.md``), ``pp_size`` the pipeline stages
    (``--pp-size`` when above 1), then ``--nnodes``, ``--node-rank`` and ``--dist-init-addr
    HOST:PORT`` (rank 0's torch.distributed rendezvous; ``distributed/bootstrap.py``) and
    ``--dist-timeout`` (seconds) when set. ``nnodes`` and ``node_rank`` may be placeholders an
    orchestrator fills (Kubernetes' ``$(LWS_GROUP_SIZE)``). SGLang turns the overlap scheduler
    off itself when ``pp_size > 1`` (``arg_groups/overrides.py`` ``_pipeline_parallel_overlap_disable``)."""

    nnodes: int | str
    node_rank: int | str
    dist_init_addr: str
    tp_size: int
    pp_size: int
    dist_timeout_s: int | None = None


def server_args(plan: Plan, profile: Profile, *, host: str = "0.0.0.0", port: int | None = None,
                model_path: str | None = None, multinode: MultiNode | None = None,
                draft_path: str | None = None) -> list[str]:
    """The SGLang flags for ``plan`` (everything after ``python -m sglang.launch_server``).

    ``host``: the address the server binds inside its network namespace (0.0.0.0 in a
    container, whose published port is bound to 127.0.0.1 unless the profile exposes it;
    127.0.0.1 natively). Secrets are never rendered here (``serve`` adds ``--api-key`` from
    the mounted file at run time). ``runtime.extra_args`` come last, as given. ``model_path``:
    the folder the server loads when it is not ``model.path`` (natively: ``model.host_dir``).
    ``multinode``: this argv is one node's of a multi-node instance (``MultiNode``).
    ``draft_path``: likewise for ``model.draft`` (natively: ``model.draft.host_dir``).
    """
    rt, m, hc = profile.runtime, profile.model, plan.hicache
    f = key_flag  # each flag as the profile key that feeds it declares it
    a: list[str] = [f("model.path"), model_path or m.path]
    if m.served_model_name:
        a += [f("model.served_model_name"), m.served_model_name]
    a += ["--host", host, f("container.port"), str(port or profile.container.port)]
    a += [f("runtime.tp_size"), str(multinode.tp_size if multinode else rt.tp_size)]
    if multinode and multinode.pp_size > 1:
        a += ["--pp-size", str(multinode.pp_size)]
    if m.quantization:
        a += [f("model.quantization"), m.quantization]
    if m.trust_remote_code:
        a += [f("model.trust_remote_code")]
    if rt.speculative is not None:
        sp = rt.speculative
        a += [f("runtime.speculative.algorithm"), sp.algorithm]
        for name in ("num_steps", "eagle_topk", "num_draft_tokens"):
            value = getattr(sp, name)
            if value is not None:
                a += [f(f"runtime.speculative.{name}"), str(value)]
    if m.draft is not None:
        a += [f("model.draft.path"), draft_path or m.draft.path]
    if rt.context_length:
        a += [f("runtime.context_length"), str(rt.context_length)]
    a += [f("runtime.max_total_tokens"), str(plan.per_rank.device_kv_tokens)]
    if plan.hybrid and plan.per_rank.device_mamba_slots:
        a += [f("runtime.max_mamba_cache_size"), str(plan.per_rank.device_mamba_slots)]
    if rt.max_running_requests:
        a += [f("runtime.max_running_requests"), str(rt.max_running_requests)]
    a += [f("runtime.page_size"), str(plan.page_size)]
    a += [f("runtime.mem_fraction_static"), _fmt_float(plan.device.mem_fraction_static)]
    if rt.chunked_prefill_size is not None:
        a += [f("runtime.chunked_prefill_size"), str(rt.chunked_prefill_size)]
    if rt.cuda_graph_max_bs is not None:
        a += [f("runtime.cuda_graph_max_bs"), str(rt.cuda_graph_max_bs)]
    if rt.disable_prefill_cuda_graph:
        a += [f("runtime.disable_prefill_cuda_graph")]
    a += [f("runtime.kv_cache.dtype"), rt.kv_cache.dtype]
    if rt.kv_cache.dtype == "int2":
        a += [f("runtime.kv_cache.int2.group_size"), str(rt.kv_cache.int2.group_size)]
    if rt.mamba_ssm_dtype:
        a += [f("runtime.mamba_ssm_dtype"), rt.mamba_ssm_dtype]
    if plan.mamba_radix_cache_strategy:
        a += [f("runtime.mamba_radix_cache_strategy"), plan.mamba_radix_cache_strategy]
    for key, on in (("runtime.enable_mixed_chunk", rt.enable_mixed_chunk),
                    ("runtime.disable_radix_cache", rt.disable_radix_cache),
                    ("runtime.enable_int8_mamba_checkpoint", rt.enable_int8_mamba_checkpoint)):
        if on:
            a += [f(key)]
    if rt.attention_backend:
        a += [f("runtime.attention_backend"), rt.attention_backend]
    if plan.custom_all_reduce_disabled:  # decided by the planner (its launch_values step)
        a += [f("runtime.disable_custom_all_reduce")]
    if rt.enable_cache_report:
        a += [f("runtime.enable_cache_report")]
    if rt.enable_metrics:
        a += [f("runtime.enable_metrics")]
    if hc.enabled:
        a += [f("hicache.enabled")]
        if hc.size_gb:
            a += [f("hicache.hicache_size"), str(hc.size_gb)]
        else:
            assert hc.ratio is not None, "the planner sets a ratio when HiCache is on without a size"
            a += [f("hicache.hicache_ratio"), _fmt_float(hc.ratio)]
        assert hc.mem_layout is not None and hc.io_backend is not None, "set by the planner with HiCache on"
        a += [f("hicache.hicache_mem_layout"), hc.mem_layout, f("hicache.hicache_io_backend"), hc.io_backend,
              f("hicache.hicache_host_memory_mode"), profile.hicache.hicache_host_memory_mode,
              f("hicache.hicache_write_policy"), profile.hicache.hicache_write_policy]
        if hc.storage_backend:
            a += [f("hicache.l3.kind"), hc.storage_backend]
    a += list(rt.extra_args)
    if multinode:
        a += ["--nnodes", str(multinode.nnodes), "--node-rank", str(multinode.node_rank),
              "--dist-init-addr", multinode.dist_init_addr]
        if multinode.dist_timeout_s:
            a += ["--dist-timeout", str(multinode.dist_timeout_s)]
    return a


def file_l3_store(plan: Plan, profile: Profile, *, l3_dir: str | None = CONTAINER_L3_DIR) -> tuple[str, int | None] | None:
    """The file L3 store the server of ``plan`` writes to: ``(directory, cap)``, the directory as
    the server sees it (``l3_dir``: ``CONTAINER_L3_DIR`` in a container, where ``hicache.l3.dir``
    is mounted; natively ``hicache.l3.dir`` itself) and the cap in bytes (``hicache.l3.max_size``;
    ``None``: no cap); ``None`` when the plan has no file L3 (HiCache off, or another backend).
    SGLang reads them from ``SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR`` (``srt/mem_cache/
    hicache_storage.py: HiCacheFile.__init__``) and ``SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE``
    (``srt/mem_cache/storage/file/lru_file_evictor.py: LRUFileEvictor._load_config``; both
    declared in ``srt/environ.py``), which ``server_env`` renders from this; ``launch_spec.LaunchNeeds`` carries the same pair for
    ``serve --spec``'s check of the folder."""
    hc = plan.hicache
    if not (hc.enabled and hc.storage_backend == "file"):
        return None
    return l3_dir or (profile.hicache.storage_dir or ""), profile.hicache.storage_max_size


def register_chunk_gib(plan: Plan) -> int | None:
    """``REGISTER_CHUNK_GIB`` when one of the plan's host buffers on the cudaHostRegister path
    (``HostBuffer.allocator == "register"``, per rank) is larger than it, else ``None`` (SGLang's
    default stands). SGLang splits a buffer at whole copy pages of its layout
    (``registration_granularity_bytes``: a KV page in page-first layouts, one mamba slot), each
    far below 16 GiB; a layer-first KV buffer is still one call (``pool_host/mha.py:
    init_kv_buffer``)."""
    limit = REGISTER_CHUNK_GIB * 2**30
    if plan.hicache.enabled and any(b.allocator == "register" and b.requested_bytes > limit
                                    for b in plan.per_rank.host_buffers):
        return REGISTER_CHUNK_GIB
    return None


def server_env(plan: Plan, profile: Profile, *, l3_dir: str | None = CONTAINER_L3_DIR) -> dict[str, str]:
    """Environment the runtime reads for ``plan`` (no secrets).

    - ``ESCHA_HICACHE_HOST_RESERVE_BYTES``: ``plan.hicache.host_reserve_bytes``, which the
      planner sets when the runtime has the ``hicache-host-reserve-env`` capability (else the
      stock 10 GiB applies);
    - ``ESCHA_HICACHE_HOST_ALLOCATOR``: ``pinned`` on WSL2, doctor's pick or ``auto`` elsewhere;
    - ``ESCHA_HICACHE_HOST_MAMBA_SLOTS``: ``plan.hicache.host_mamba_slots``, the host mamba states
      the planner set under patch 0004 (``hicache.host_mamba_slots``; unset: device slots x ratio);
    - INT2 layout (``SGLANG_MIXED_KV_SCALE_DTYPE``), read by the OSCAR overlay, and its mixed HP+INT2
      window (``SGLANG_ENABLE_MIXED_KV_WINDOWS=1`` with ``SGLANG_MIXED_KV_HP_DTYPE``, ``_PREFIX_TOKENS``,
      ``_RECENT_TOKENS``) only where the plan counts that window's arena (``runtime.kv_cache.int2.mixed_windows``);
    - ``NCCL_P2P_DISABLE=1`` under WSL2 and where NVML shows no peer access (``plan.nccl_p2p_disabled``;
      microsoft/WSL#12467, NVIDIA/nccl#1637) or where doctor's all-reduce smoke test passed only
      with it, and the rest of what that test passed with (``plan.nccl_env``); ``NO_PROXY`` for
      loopback (sglang#9814);
    - the L3 file backend's directory, cap and free-space watermark (``SGLANG_HICACHE_FILE_BACKEND_*``,
      ``file_l3_store``; the watermark ``_MIN_FREE_SPACE``, ``LRUFileEvictor._load_config``);
    - ``SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1`` when ``runtime.allow_longer_context_length``;
    - ``SGLANG_HICACHE_HOST_REGISTER_CHUNK_GB`` (``register_chunk_gib``) when a host buffer on the
      cudaHostRegister path is larger than ``REGISTER_CHUNK_GIB``;
    - Mooncake's master and global segment (``MOONCAKE_MASTER``, ``MOONCAKE_GLOBAL_SEGMENT_SIZE``,
      read by ``srt/mem_cache/storage/mooncake_store/mooncake_store.py``).
    """
    env: dict[str, str] = {"NO_PROXY": NO_PROXY, "no_proxy": NO_PROXY}
    hc = plan.hicache
    if hc.enabled and hc.host_reserve_bytes is not None:  # decided by the planner (host_pools)
        env[ENV_HOST_RESERVE] = str(hc.host_reserve_bytes)
    if hc.enabled and hc.host_allocator:
        env[ENV_HOST_ALLOCATOR] = hc.host_allocator
    if hc.enabled and hc.host_mamba_slots is not None:  # decided by the planner (host_mamba)
        env[ENV_HOST_MAMBA_SLOTS] = str(hc.host_mamba_slots)
    chunk = register_chunk_gib(plan)
    if chunk is not None:
        env[ENV_REGISTER_CHUNK] = str(chunk)
    rt = profile.runtime
    if rt.kv_cache.dtype == "int2":
        i2 = rt.kv_cache.int2
        # the scale dtype is the INT2 layout's, read with or without the window
        env[key_env("runtime.kv_cache.int2.scale_dtype")] = i2.scale_dtype
        if plan.per_rank.device_int2_hp_bytes:  # the planner counted the mixed window: it is built
            env.update({
                key_env("runtime.kv_cache.int2.mixed_windows"): "1",
                key_env("runtime.kv_cache.int2.hp_dtype"): i2.hp_dtype,
                key_env("runtime.kv_cache.int2.prefix_tokens"): str(i2.prefix_tokens),
                key_env("runtime.kv_cache.int2.recent_tokens"): str(i2.recent_tokens),
            })
    if plan.nccl_p2p_disabled:
        env[key_env("container.nccl_p2p_disable")] = "1"
    env.update(plan.nccl_env)  # the rest of what doctor's smoke test passed with (planner: launch_values)
    if rt.allow_longer_context_length:
        env[key_env("runtime.allow_longer_context_length")] = "1"
    store = file_l3_store(plan, profile, l3_dir=l3_dir)
    if store is not None:
        env[key_env("hicache.l3.dir")] = store[0]
        if store[1]:
            env[key_env("hicache.l3.max_size")] = str(store[1])
        if profile.hicache.storage_min_free:  # bytes; SGLang's human_readable_int takes a plain number
            env[key_env("hicache.l3.min_free_space")] = str(profile.hicache.storage_min_free)
    l3 = profile.hicache.l3
    if hc.enabled and hc.storage_backend == "mooncake" and isinstance(l3, L3Mooncake):
        if l3.master:
            env[key_env("hicache.l3.master")] = l3.master
        if l3.global_segment_size:  # bytes; SGLang's EnvStr takes a plain number
            env[key_env("hicache.l3.global_segment_size")] = str(l3.global_segment_size)
    return env


#: SGLang's ``--config`` option (``sglang/srt/server_args.py`` ``prepare_server_args`` and
#: ``utils/server_args_config_parser.py``): a YAML file whose keys become flags. ``serve`` passes
#: secrets through it (a private 0600 file) so they never appear in any command line.
CONFIG_FLAG = "--config"


def secret_config(api_key: str | None) -> dict[str, str]:
    """The ``--config`` YAML entries carrying secrets (``--api-key``, ``container.api_key_file``'s
    flag), keyed as SGLang's flags without their dashes."""
    return {key_flag("container.api_key_file").removeprefix("--"): api_key} if api_key else {}


def multinode_env(nic: str | None) -> dict[str, str]:
    """Environment of a node without InfiniBand: NCCL's socket transport on ``nic``
    (``NCCL_SOCKET_IFNAME``, ``NCCL_IB_DISABLE=1``; NCCL docs "Environment Variables") and Gloo's
    CPU groups on the same interface (``GLOO_SOCKET_IFNAME``), as GPUStack's SGLang backend sets
    them (``gpustack/worker/backends/sglang.py``). Without ``nic`` NCCL picks an interface
    itself (any but lo and docker*), which may be the wrong one on a multi-homed box."""
    env = {"NCCL_IB_DISABLE": "1"}
    if nic:
        env.update({"NCCL_SOCKET_IFNAME": nic, "GLOO_SOCKET_IFNAME": nic})
    return env
