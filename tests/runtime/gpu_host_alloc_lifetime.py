"""A pinned host block's lifetime on a real CUDA GPU: one job per process, one JSON line out.

Run by ``tests/runtime/test_host_alloc_lifetime_gpu.py`` (a fault kills only this process, and
the test names it); needs only torch with CUDA and this checkout:

    python tests/runtime/gpu_host_alloc_lifetime.py lifetime --bytes 2147483648
    python tests/runtime/gpu_host_alloc_lifetime.py after-destroy
    python tests/runtime/gpu_host_alloc_lifetime.py failed-alloc

The buffers are made by the hook the patched SGLang calls (``escha_host_alloc.alloc_pinned``),
viewed the way SGLang 0.5.19's host pools view theirs (``pool_host/mamba.py``: ``temporal_buffer``
and ``conv_buffer`` stay on the pool after ``destroy()``, and ``temporal_buffer[layer_id]`` per
layer; the MHA pool's per-layer views), and "destroyed" the way ``pool_host/base.py:
HostKVCache.destroy`` does it: ``_cuda_host_unregister`` skips a buffer whose registered-range
list is empty, then the pool's ``kv_buffer`` reference is dropped. SGLang itself is not imported
(the job runs where only torch is installed); ``Pool`` below holds the buffers as a pool does.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from escha_deploy.runtime.hooks import host_alloc as ha  # noqa: E402

LAYERS = 8


def mem_available() -> int:
    """``MemAvailable`` of ``/proc/meminfo``, bytes."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def settle() -> int:
    """MemAvailable after a collection and a short pause (the kernel's counters lag a little)."""
    gc.collect()
    time.sleep(0.5)
    return mem_available()


class Pool:
    """Holds a buffer as SGLang's host pool does: ``kv_buffer`` plus views kept on the pool."""

    def __init__(self, buffer):
        self.kv_buffer = buffer
        self.temporal_buffer = buffer                    # mamba.py keeps the whole buffer
        self.layer_views = [buffer[i] for i in range(buffer.shape[0])]  # per-layer views

    def destroy(self) -> None:
        """``base.py: HostKVCache.destroy``: unregister what was registered (nothing, for
        ``alloc_pinned``'s buffers), then drop ``kv_buffer``."""
        assert getattr(self.kv_buffer, ha._REGISTERED_RANGES_ATTR) == []
        self.kv_buffer = None


def _cuda():
    import torch

    torch.cuda.init()
    torch.zeros(1, device="cuda")
    return torch


def job_lifetime(nbytes: int) -> dict:
    """MemAvailable around allocation, ``destroy()`` and the last view's death."""
    torch = _cuda()
    before = settle()
    buf = ha.alloc_pinned((LAYERS, nbytes // LAYERS // 2), torch.bfloat16)
    buf.fill_(1)
    finalizer = getattr(buf, ha._PINNED_FREE_ATTR)
    pool = Pool(buf)
    del buf
    allocated = settle()
    pool.destroy()
    kept = pool.layer_views[LAYERS - 1]                  # a view that outlives destroy()
    pool.temporal_buffer = None
    pool.layer_views = []
    destroyed = settle()
    alive_after_destroy = finalizer.alive
    read_ok = bool((kept == 1).all())                    # read after destroy()
    del kept, pool
    released = settle()
    return {"bytes": nbytes, "pinned_at_alloc": before - allocated,
            "still_pinned_after_destroy": before - destroyed,
            "returned_when_last_view_died": released - destroyed,
            "freed_at_destroy": not alive_after_destroy, "freed_at_last_view": not finalizer.alive,
            "read_after_destroy_ok": read_ok}


def job_after_destroy() -> dict:
    """Reads and writes through views after ``destroy()``: CPU, host->device and device->host
    copies (the transfers HiCache makes). A use-after-free faults here (SIGSEGV) instead."""
    torch = _cuda()
    n = 64 * 2**20
    buf = ha.alloc_pinned((LAYERS, n // LAYERS // 4), torch.float32)
    buf.copy_(torch.arange(buf.numel(), dtype=torch.float32).view(buf.shape))
    pool = Pool(buf)
    del buf
    pool.destroy()
    gc.collect()
    view = pool.temporal_buffer[3]
    cpu_sum = float(view.double().sum())
    dev = view.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    dev_sum = float(dev.double().sum())
    view.copy_(torch.full_like(dev, 2.0), non_blocking=True)   # device -> host into the view
    torch.cuda.synchronize()
    back = float(view.double().sum())
    return {"cpu_sum": cpu_sum, "device_sum": dev_sum, "written_sum": back,
            "expected_written_sum": 2.0 * view.numel(), "is_pinned": bool(view.is_pinned())}


def job_failed_alloc() -> dict:
    """An absurd cudaHostAlloc (1 PiB, beyond x86_64's 128 TiB user address space, so no page is
    touched) fails; then the thread's last CUDA error, the next kernels and the next pinned
    allocation."""
    torch = _cuda()
    err = None
    try:
        ha.alloc_pinned((2**50,), torch.uint8)
    except RuntimeError as exc:
        err = str(exc)
    lib = ha.cudart()
    left = int(lib.cudaPeekAtLastError())
    out: dict = {"error": err, "last_error_after_failure": left}
    try:
        x = torch.arange(1 << 20, device="cuda", dtype=torch.int64)
        out["kernel_sum"] = int((x * 2).sum().item())
        small = ha.alloc_pinned((1 << 20,), torch.uint8)
        small.fill_(3)
        out["pinned_roundtrip_sum"] = int(small.to("cuda").sum().item())
        torch.cuda.synchronize()
        out["next_call_error"] = None
    except RuntimeError as exc:
        out["next_call_error"] = str(exc)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("job", choices=("lifetime", "after-destroy", "failed-alloc"))
    ap.add_argument("--bytes", type=int, default=2 * 2**30, help="lifetime: bytes of the buffer")
    args = ap.parse_args(argv)
    if args.job == "lifetime":
        out = job_lifetime(args.bytes)
    elif args.job == "after-destroy":
        out = job_after_destroy()
    else:
        out = job_failed_alloc()
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
