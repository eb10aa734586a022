"""SGLang 0.5.19's real host pools on a CUDA machine, patched by our series (one process per job).

Run by ``tests/runtime/test_host_pools_gpu.py`` as ``python tests/runtime/gpu_host_pools.py JOB
--site DIR ...`` with the patched sglang tree ``DIR`` (``runtime apply`` on the unzipped
wheel) first on ``sys.path``. Prints one JSON object as its last line. Jobs:

- ``roundtrip --profile P --ratio R --allocator A``: device pools of the wheel's own classes
  (``memory_pool.py: MHATokenToKVPool``, ``MambaPool``) at ``P``'s per-rank shapes and the
  plan's pool sizes, host pools (``MHATokenToKVPoolHost``, ``MambaPoolHost``, ``pin_memory=True``)
  at ratio ``R`` with ``ESCHA_HICACHE_HOST_ALLOCATOR=A``; for MHA page_first, MHA layer_first
  and mamba page_first on the ``kernel`` io backend: random bytes into random device pages ->
  ``backup_from_device_all_layer`` -> compare host bytes -> zero the device ->
  ``load_to_device_per_layer`` for every layer -> compare device bytes, and count non-zero bytes
  outside the chosen pages. Host indices are on the CPU for the staged page_first write-back and
  on the GPU otherwise, as ``managers/cache_controller.py`` moves them. Also the seconds and
  GB/s (1e9) of each backup and load.
- ``reading --bytes N1,N2,... --allocator A``: in this fresh process (CUDA initialised first),
  for each size in turn, allocate it three times through the patched ``pool_host/common.py``
  allocation function, each time reading MemAvailable before and after, then freeing it as the
  pool's ``destroy()`` does (one buffer alive at a time); the median drop. ``torch`` instead:
  one ``torch.empty(pin_memory=True)`` (the caching allocator) and ``torch.cuda.host_memory_stats``.
- ``refusals``: the geometry check refuses a real ``MHATokenToKVPoolFP4`` behind a full-width
  host pool (patch 0003, ``build_kv_host_pool``), and the 4 GiB cap refuses one pinned buffer of
  5,368,971,264 B before allocating (patch 0002) while ``register`` takes it.

Stand-ins: under the serving closure (``scripts/gpu_closure.py``) ``sgl_kernel`` (0.4.5, sm90
ops) and ``flashinfer`` are real and none is used. Where one of them does not import (another
machine's SGLang tree: sglang-kernel 0.4.6.post1 is built for torch 2.13), it is replaced by a
module whose every attribute is a function that records its call and raises. The job's JSON
lists the calls (``standin_calls``): on the ``kernel`` io backend there must be none.
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import json
import os
import statistics
import sys
import time
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STANDIN_MODULES = ("sgl_kernel", "flashinfer")
STANDIN_CALLS: list[str] = []
DEVICE_NOTES: list[str] = []
GB = 1e9


class _Placeholder:
    """An attribute of a stand-in module: attribute chains and hashing work (module-level code
    such as ``flashinfer.X.Y`` in a default argument); calling it records the call and raises."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> "_Placeholder":
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Placeholder(f"{self._name}.{attr}")

    def __call__(self, *_a, **_k):
        STANDIN_CALLS.append(self._name)
        raise RuntimeError(f"stand-in {self._name} called: not available on this machine")

    def __repr__(self) -> str:
        return f"<stand-in {self._name}>"


class _StandinModule(types.ModuleType):
    """A stand-in module: every attribute a ``_Placeholder``."""

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = _Placeholder(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _StandinFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in STANDIN_MODULES:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        mod = _StandinModule(spec.name)
        mod.__path__ = []
        mod.__file__ = "<escha stand-in>"
        mod.__version__ = "0.0.0+escha-stand-in"
        return mod

    def exec_module(self, module):
        return None


def install_standins() -> list[str]:
    """Stand-ins for the ``STANDIN_MODULES`` that do not import here; returns their names."""
    import importlib.util

    missing = []
    for name in STANDIN_MODULES:
        try:
            ok = importlib.util.find_spec(name) is not None
            if ok:
                __import__(name)
        except Exception:
            ok = False
        if not ok:
            sys.modules.pop(name, None)
            missing.append(name)
    if missing:
        finder = _StandinFinder()
        finder_names = set(missing)
        finder.find_spec = lambda fullname, path=None, target=None, _f=finder.find_spec: (
            _f(fullname, path, target) if fullname.split(".")[0] in finder_names else None)
        sys.meta_path.insert(0, finder)
    return missing


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def _plan(profile: str, ratio: float):
    from escha_deploy.facts.machine import described_host
    from escha_deploy.planner import plan
    from escha_deploy.profile import load_profile
    from escha_deploy.utils.units import GiB

    prof = load_profile(profile)
    # the ratio decides, as SGLang's --hicache-ratio does once --hicache-size is 0
    prof = prof.model_copy(update={"hicache": prof.hicache.model_copy(update={"hicache_size": 0})})
    return prof, plan(prof, described_host(16 * GiB, "wsl2"), ratio=ratio)


def _shapes(prof):
    from escha_deploy.sglang.arch import rank_shapes

    return rank_shapes(prof.model.architecture, prof.runtime.tp_size)


def _torch_dtype(torch, name: str):
    return {"fp8_e4m3": torch.float8_e4m3fn, "bf16": torch.bfloat16, "auto": torch.bfloat16,
            "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def build_device_pools(prof, p):
    """The wheel's MHATokenToKVPool and MambaPool on cuda:0 at the plan's per-rank sizes."""
    import torch
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateDType, Mamba2StateShape
    from sglang.srt.mem_cache.memory_pool import MambaPool, MHATokenToKVPool

    s, a, r = _shapes(prof), prof.model.architecture, p.per_rank
    kv = MHATokenToKVPool(size=r.device_kv_tokens, page_size=p.page_size,
                          dtype=_torch_dtype(torch, p.kv_cache_dtype), head_num=s.kv_heads_per_rank,
                          head_dim=a.head_dim, layer_num=s.full_layers, device="cuda", enable_memory_saver=False)
    mamba = None
    if p.hybrid:
        shape = Mamba2StateShape.create(
            tp_world_size=prof.runtime.tp_size, intermediate_size=a.linear_value_head_dim * a.linear_num_value_heads,
            n_groups=a.linear_num_key_heads, num_heads=a.linear_num_value_heads, head_dim=a.linear_value_head_dim,
            state_size=a.linear_key_head_dim, conv_kernel=a.linear_conv_kernel_dim)
        ssm = prof.runtime.mamba_ssm_dtype or a.mamba_ssm_dtype
        params = Mamba2CacheParams(shape=shape, layers=list(range(s.linear_layers)),
                                   dtype=Mamba2StateDType(conv=torch.bfloat16, temporal=_torch_dtype(torch, ssm)))
        try:
            mamba = MambaPool(size=r.device_mamba_slots, spec_state_size=0, cache_params=params,
                              mamba_layer_ids=list(range(s.linear_layers)), device="cuda")
        except Exception as exc:  # said in the job's JSON (mamba_device_pool), the test fails on it
            DEVICE_NOTES.append(f"MambaPool failed ({type(exc).__name__}: {exc}); real tensors of its shapes used")
            slots = r.device_mamba_slots + 1
            cache = types.SimpleNamespace(
                conv=[torch.zeros((s.linear_layers, slots, *shape.conv[0]), dtype=torch.bfloat16, device="cuda")],
                temporal=torch.zeros((s.linear_layers, slots, *shape.temporal), dtype=_torch_dtype(torch, ssm),
                                     device="cuda"))
            mamba = types.SimpleNamespace(size=r.device_mamba_slots, num_mamba_layers=s.linear_layers,
                                          device="cuda", mamba_cache=cache)
    return kv, mamba


def _fill_random(t, idx, gen):
    import torch

    shape = tuple(t[idx].shape)
    nbytes_last = shape[-1] * t.element_size()
    rnd = torch.randint(1, 256, (*shape[:-1], nbytes_last), dtype=torch.uint8, device=t.device, generator=gen)
    t[idx] = rnd.view(t.dtype)


def _as_bytes(t):
    import torch

    return t.contiguous().view(torch.uint8)


def _timed(fn):
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def _strays(layers, idx):
    """Non-zero bytes outside rows ``idx`` of each device layer tensor (rows = dim 0)."""
    import torch

    n = 0
    for t in layers:
        mask = torch.ones(t.shape[0], dtype=torch.bool, device=t.device)
        mask[idx] = False
        n += int(torch.count_nonzero(_as_bytes(t[mask])).item())
    return n


def mha_roundtrip(kv, host, pages: int, seed: int) -> dict:
    """Backup -> compare -> clear -> load -> compare for one MHA host pool."""
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)
    P = kv.page_size
    dev_pages = torch.randperm(kv.size // P, generator=gen, device="cuda")[:pages] + 1  # page 0 pads
    host_pages = torch.randperm(host.size // P, generator=gen, device="cuda")[:pages]
    offs = torch.arange(P, device="cuda")
    d_idx = (dev_pages[:, None] * P + offs).reshape(-1).to(torch.int64)
    h_idx = (host_pages[:, None] * P + offs).reshape(-1).to(torch.int64)
    for layer in range(kv.layer_num):
        _fill_random(kv.k_buffer[layer], d_idx, gen)
        _fill_random(kv.v_buffer[layer], d_idx, gen)
    want = [(_as_bytes(kv.k_buffer[layer][d_idx]).cpu(), _as_bytes(kv.v_buffer[layer][d_idx]).cpu())
            for layer in range(kv.layer_num)]
    staged = host.layout == "page_first" and getattr(host, "can_use_write_back_jit", False)
    h_backup = h_idx.cpu() if staged else h_idx
    backup_s = _timed(lambda: host.backup_from_device_all_layer(kv, h_backup, d_idx, "kernel"))
    hk, hv = host.k_buffer, host.v_buffer
    h_cpu = h_idx.cpu()
    host_equal = True
    for layer in range(kv.layer_num):
        if host.layout == "layer_first":
            got_k, got_v = hk[layer][h_cpu], hv[layer][h_cpu]
        else:
            got_k, got_v = hk[h_cpu, layer], hv[h_cpu, layer]
        host_equal &= torch.equal(_as_bytes(got_k), want[layer][0]) and torch.equal(_as_bytes(got_v), want[layer][1])
    for layer in range(kv.layer_num):
        kv.k_buffer[layer].zero_()
        kv.v_buffer[layer].zero_()

    def load():
        for layer in range(kv.layer_num):
            host.load_to_device_per_layer(kv, h_idx, d_idx, layer, "kernel")

    load_s = _timed(load)
    dev_equal = all(torch.equal(_as_bytes(kv.k_buffer[layer][d_idx]).cpu(), want[layer][0])
                    and torch.equal(_as_bytes(kv.v_buffer[layer][d_idx]).cpu(), want[layer][1])
                    for layer in range(kv.layer_num))
    strays = _strays([*kv.k_buffer, *kv.v_buffer], d_idx)
    moved = sum(w[0].numel() + w[1].numel() for w in want)
    return {"pages": pages, "bytes": moved, "host_equal": bool(host_equal), "device_equal": bool(dev_equal),
            "stray_bytes": strays, "backup_s": backup_s, "load_s": load_s,
            "backup_gbps": moved / backup_s / GB, "load_gbps": moved / load_s / GB,
            "host_indices_for_backup": "cpu" if staged else "cuda"}


def mamba_roundtrip(mamba, host, slots: int, seed: int) -> dict:
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)
    d_idx = (torch.randperm(mamba.size, generator=gen, device="cuda")[:slots] + 1).to(torch.int64)
    h_idx = torch.randperm(host.size, generator=gen, device="cuda")[:slots].to(torch.int64)
    cache = mamba.mamba_cache
    tensors = [cache.temporal, *cache.conv]  # each (layers, slots + 1, ...)
    for t in tensors:
        for layer in range(t.shape[0]):
            _fill_random(t[layer], d_idx, gen)
    want = [_as_bytes(t[:, d_idx]).cpu() for t in tensors]
    h_cpu = h_idx.cpu()
    backup_s = _timed(lambda: host.backup_from_device_all_layer(mamba, h_cpu, d_idx, "kernel"))
    hosts = [host.temporal_buffer, *host.conv_buffer]   # page_first: (slots, layers, 1, ...)
    host_equal = all(torch.equal(_as_bytes(hb[h_cpu].squeeze(2).transpose(0, 1)), w) for hb, w in zip(hosts, want))
    for t in tensors:
        t.zero_()

    def load():
        for layer in range(host.num_mamba_layers):
            host.load_to_device_per_layer(mamba, h_idx, d_idx, layer, "kernel")

    load_s = _timed(load)
    dev_equal = all(torch.equal(_as_bytes(t[:, d_idx]).cpu(), w) for t, w in zip(tensors, want))
    strays = sum(_strays([t[layer] for layer in range(t.shape[0])], d_idx) for t in tensors)
    moved = sum(w.numel() for w in want)
    return {"slots": slots, "bytes": moved, "host_equal": bool(host_equal), "device_equal": bool(dev_equal),
            "stray_bytes": strays, "backup_s": backup_s, "load_s": load_s,
            "backup_gbps": moved / backup_s / GB, "load_gbps": moved / load_s / GB}


def _buffer_bytes(t) -> int:
    return t.numel() * t.element_size()


def job_roundtrip(args) -> dict:
    import torch
    from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

    os.environ["ESCHA_HICACHE_HOST_ALLOCATOR"] = args.allocator
    prof, p = _plan(args.profile, args.ratio)
    kv, mamba = build_device_pools(prof, p)
    planned = {b.name: b.pinned_bytes for b in p.per_rank.host_buffers}
    out = {"profile": args.profile, "ratio": args.ratio, "allocator": args.allocator, "layouts": {},
           "planned_buffers": planned}
    for layout in ("page_first", "layer_first"):
        host = None
        try:
            host = MHATokenToKVPoolHost(kv, args.ratio, 0, p.page_size, layout, pin_memory=True, device="cpu")
            buf = host.kv_buffer
            row = {"host_tokens": int(host.size), "buffer_bytes": _buffer_bytes(buf),
                   "plan_host_tokens": p.per_rank.host_kv_tokens, "pinned_by_hook": hasattr(buf, "_escha_cuda_host_free"),
                   "is_pinned": bool(buf.is_pinned())}
            for name, pages in (("one_page", 1), ("1gib", max(1, 2**30 // (p.page_size * kv.layer_num * 2
                                                                      * _buffer_bytes(kv.k_buffer[0][0]))))):
                pages = min(pages, kv.size // p.page_size - 1, host.size // p.page_size)
                row[name] = mha_roundtrip(kv, host, pages, seed=len(out["layouts"]) + pages)
            out["layouts"][f"mha_{layout}"] = row
        finally:
            if host is not None:
                host.destroy()
    if mamba is not None:
        host = None
        try:
            host = MambaPoolHost(mamba, args.ratio, 0, pin_memory=True, device="cpu", layout="page_first")
            row = {"host_slots": int(host.size), "plan_host_slots": p.per_rank.host_mamba_slots,
                   "temporal_bytes": _buffer_bytes(host.temporal_buffer),
                   "conv_bytes": [_buffer_bytes(c) for c in host.conv_buffer],
                   "pinned_by_hook": hasattr(host.temporal_buffer, "_escha_cuda_host_free")}
            row["one_slot"] = mamba_roundtrip(mamba, host, 1, seed=7)
            row["all_slots"] = mamba_roundtrip(mamba, host, min(mamba.size, host.size), seed=8)
            out["layouts"]["mamba_page_first"] = row
        finally:
            if host is not None:
                host.destroy()
    torch.cuda.synchronize()
    return out


def job_reading(args) -> dict:
    import torch

    torch.cuda.init()
    torch.zeros(1, device="cuda")
    sizes = [int(b) for b in str(args.bytes).split(",")]
    if args.allocator == "torch":
        # one request: the caching allocator keeps a freed block, so a second would reuse it
        n = sizes[0]
        before = mem_available()
        t = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        drop = before - mem_available()
        stats = {k: v for k, v in torch.cuda.host_memory_stats().items()
                 if k.startswith(("allocated_bytes.all.current", "reserved_bytes.all.current"))}
        del t
        return {"readings": [{"request": n, "allocator": "torch", "drops": [drop], "drop": drop,
                              "host_memory_stats": stats}]}
    os.environ["ESCHA_HICACHE_HOST_ALLOCATOR"] = args.allocator
    from sglang.srt.mem_cache.pool_host import common

    alloc = common.ALLOC_MEMORY_FUNCS["cuda"]
    readings = []
    for n in sizes:  # one buffer at a time: each freed, as the pool's destroy() frees it, before the next
        drops, by_hook = [], None
        for _ in range(3):
            before = mem_available()
            buf = alloc((n,), torch.uint8, "cpu", True, common.get_allocator_from_storage("default"))
            drops.append(before - mem_available())
            by_hook = hasattr(buf, "_escha_cuda_host_free")
            common._cuda_host_unregister(buf)
            del buf
            time.sleep(0.2)
        readings.append({"request": n, "allocator": args.allocator, "by_hook": by_hook, "drops": drops,
                         "drop": int(statistics.median(drops))})
    return {"readings": readings}


def job_refusals(args) -> dict:
    import torch
    from sglang.srt.mem_cache.pool_host import common
    from sglang.srt.mem_cache.pool_host import escha_host_alloc as ha

    out = {}
    os.environ["ESCHA_HICACHE_HOST_ALLOCATOR"] = "pinned"
    n = 5_368_971_264
    before = mem_available()
    try:
        common.ALLOC_MEMORY_FUNCS["cuda"]((n,), torch.uint8, "cpu", True, common.get_allocator_from_storage("default"))
        out["cap_pinned"] = "accepted"
    except ha.PinnedAllocationTooLarge as exc:
        out["cap_pinned"] = f"refused: {type(exc).__name__}"
    out["cap_pinned_drop"] = before - mem_available()
    os.environ["ESCHA_HICACHE_HOST_ALLOCATOR"] = "register"
    buf = common.ALLOC_MEMORY_FUNCS["cuda"]((n,), torch.uint8, "cpu", True, common.get_allocator_from_storage("default"))
    out["cap_register"] = "accepted" if _buffer_bytes(buf) == n else "wrong size"
    common._cuda_host_unregister(buf)
    del buf
    out["geometry"] = _geometry_refusal()
    return out


def _geometry_refusal() -> str:
    """A real MHATokenToKVPoolFP4 (uint8 rows half the width) behind the full-width host pool
    ``get_mha_host_pool_cls`` would not pick for it: patch 0003's ``check_host_pool`` (what the
    patched ``build_kv_host_pool`` calls on every host pool it builds) must refuse the pair."""
    import torch
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPoolFP4
    from sglang.srt.mem_cache.pool_host import escha_transfer_geometry as geo
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

    dev = MHATokenToKVPoolFP4(size=4096, page_size=8, dtype=torch.uint8, head_num=2, head_dim=256,
                              layer_num=2, device="cuda", enable_memory_saver=False)
    host = MHATokenToKVPoolHost(dev, 1.0, 0, 8, "layer_first", pin_memory=False, device="cpu")
    try:
        geo.check_host_pool(host, dev, "kv")
    except geo.TransferGeometryError as exc:
        return f"refused: TransferGeometryError: {' '.join(str(exc).split())[:200]}"
    finally:
        host.destroy()
    return "accepted"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("job", choices=("roundtrip", "reading", "refusals"))
    ap.add_argument("--site", required=True, help="the patched sglang tree (runtime apply)")
    ap.add_argument("--profile", default="rtx5060ti-tp2-fp8")
    ap.add_argument("--ratio", type=float, default=1.0)
    ap.add_argument("--allocator", default="pinned", choices=("pinned", "register", "torch"))
    ap.add_argument("--bytes", default="0", help="bytes to allocate; reading: comma-separated sizes")
    args = ap.parse_args(argv)
    sys.path.insert(0, args.site)
    sys.path.insert(1, str(REPO))
    standins = install_standins()
    t0 = time.perf_counter()
    try:
        result = {"ok": True, **{"roundtrip": job_roundtrip, "reading": job_reading,
                                 "refusals": job_refusals}[args.job](args)}
    except Exception as exc:  # reported, the test fails on it
        import traceback

        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-4000:]}
    result.update(job=args.job, standins=standins, standin_calls=STANDIN_CALLS, device_notes=DEVICE_NOTES,
                  seconds=round(time.perf_counter() - t0, 2))
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
