"""Pinned-memory ceiling probe: pin growing amounts in one process, up to a target.

Run as ``python -m escha_deploy.doctor.pinned_ceiling --target BYTES [--step BYTES]
[--allocator pinned|register]``. It pins ``step`` bytes at a time (each a separate
allocation, kept), so the pinned total grows by ``step`` until it reaches ``target`` or an
allocation fails. After each success it prints ``{"pinned": TOTAL}`` and flushes, so a parent
that sees the process killed (OOM, timeout) still knows the largest total that worked. The
last line is ``{"done": true, "largest": BYTES, "reached": BOOL, "error": ...}``; ``reached``
is true only when an allocation really failed (a ceiling), false when the target was met;
``"ran": false`` says the ladder could not run here (no torch, or no CUDA device visible to it).

Why cumulative in one process: a rank's host pools (KV, then mamba) are separate allocations
kept by one process; the WSL2 ceiling reports are about the process total (FreeToken PR #233
pinned 256 MiB steps cumulatively; microsoft/WSL#14078 saw ~500 MB). The default step is
256 MiB for the same reason. ``pinned`` allocates as the patched runtime does
(``runtime/hooks/host_alloc.py: alloc_pinned``: one cudaHostAlloc of the exact size, not torch's
caching host allocator, which rounds each block up to a power of two); ``register`` with an
anonymous ``MAP_SHARED`` mmap, pre-faulted, then ``cudaHostRegister(flags=0)`` as SGLang 0.5.19
does.

``--buffers B1,B2,...`` (the plan's per-rank host buffers): after a ladder that met its target,
everything is freed and each size is pinned alone, reading MemAvailable before and after; the
summary's ``buffers`` lists ``{"request": B, "pinned": drop}`` ("pinned X for a request of Y").
A pinned buffer above 4 GiB is not tried (the runtime refuses it, sglang#7666).

A failed pinned allocation leaves a sticky CUDA error (microsoft/WSL#14078): one process per probe.
Stdlib only at module level.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import sys
import time

DEFAULT_STEP = 256 * 2**20


def _emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _pin_exact(size: int, keep: list) -> None:
    import torch

    from escha_deploy.runtime.hooks.host_alloc import alloc_pinned

    keep.append(alloc_pinned((size,), torch.uint8))


def _release(keep: list) -> None:
    """Free what ``_pin_exact`` / ``_pin_register`` pinned."""
    import torch

    cudart = None
    while keep:
        item = keep.pop()
        if isinstance(item, mmap.mmap):
            cudart = cudart or torch.cuda.cudart()
            cudart.cudaHostUnregister(ctypes.addressof(ctypes.c_char.from_buffer(item)))
            item.close()
        else:
            del item  # a tensor of alloc_pinned: its block is freed with its last view


def _mem_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def read_buffers(sizes: list[int], allocator: str) -> list[dict]:
    """Pin each of ``sizes`` alone and read what MemAvailable fell by; freed after each."""
    from escha_deploy.runtime.hooks.host_alloc import PINNED_MAX_BYTES

    pin = _pin_exact if allocator == "pinned" else _pin_register
    out = []
    for size in sizes:
        if allocator == "pinned" and size > PINNED_MAX_BYTES:
            out.append({"request": size, "pinned": None, "error": "above the 4 GiB cap on one pinned buffer"})
            continue
        keep: list = []
        before = _mem_available()
        try:
            pin(size, keep)
        except Exception as exc:
            out.append({"request": size, "pinned": None, "error": f"{type(exc).__name__}: {exc}"})
            break  # a failed pin can leave a sticky CUDA error
        after = _mem_available()
        _release(keep)
        out.append({"request": size, "pinned": None if before is None or after is None else before - after})
        time.sleep(0.1)
    return out


def _pin_register(size: int, keep: list) -> None:
    import torch

    mm = mmap.mmap(-1, size, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0),
                   prot=mmap.PROT_READ | mmap.PROT_WRITE)
    ptr = ctypes.addressof(ctypes.c_char.from_buffer(mm))
    cudart = torch.cuda.cudart()
    rc = int(cudart.cudaHostRegister(ptr, size, 0))
    if rc != 0:
        mm.close()
        raise RuntimeError(f"cudaHostRegister rc={rc}: {cudart.cudaGetErrorString(rc)}")
    keep.append(mm)


def probe(target: int, step: int, allocator: str, buffers: list[int] = ()) -> dict:
    """Pin ``step`` bytes at a time until ``target`` bytes or a failure; then, when it met the
    target, each of ``buffers`` alone (``read_buffers``); returns the summary."""
    import torch

    if not torch.cuda.is_available():
        return {"done": True, "largest": 0, "reached": False, "ran": False, "error": "no CUDA device visible to torch"}
    torch.cuda.init()
    pin = _pin_exact if allocator == "pinned" else _pin_register
    keep: list = []
    total = 0
    t0 = time.monotonic()
    while total < target:
        size = min(step, target - total)
        try:
            pin(size, keep)
        except Exception as exc:  # the ceiling: report it, do not raise
            msg = " ".join(str(exc).split()) or type(exc).__name__
            return {"done": True, "largest": total, "reached": True, "failed_at": total + size,
                    "error": f"{type(exc).__name__}: {msg}", "seconds": round(time.monotonic() - t0, 2)}
        total += size
        _emit({"pinned": total})
    summary = {"done": True, "largest": total, "reached": False, "error": None,
               "seconds": round(time.monotonic() - t0, 2)}
    if buffers:
        _release(keep)
        summary["buffers"] = read_buffers(list(buffers), allocator)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m escha_deploy.doctor.pinned_ceiling",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=int, required=True, help="bytes to pin at most")
    parser.add_argument("--step", type=int, default=DEFAULT_STEP, help="bytes per allocation")
    parser.add_argument("--allocator", default="pinned", choices=("pinned", "register"))
    parser.add_argument("--buffers", default="", help="comma-separated buffer sizes (bytes) to pin one at a time")
    args = parser.parse_args(argv)
    if args.target <= 0 or args.step <= 0:
        parser.error("--target and --step must be positive byte counts")
    try:
        buffers = [int(b) for b in args.buffers.split(",") if b.strip()]
    except ValueError:
        parser.error("--buffers: expected comma-separated byte counts")
    if any(b <= 0 for b in buffers):
        parser.error("--buffers: byte counts must be positive")
    try:
        result = probe(args.target, args.step, args.allocator, buffers)
    except ImportError as exc:  # no torch here: the ladder did not run (unknown, not a ceiling)
        result = {"done": True, "largest": 0, "reached": False, "ran": False, "error": f"{type(exc).__name__}: {exc}"}
    except Exception as exc:
        result = {"done": True, "largest": 0, "reached": False,
                  "error": f"{type(exc).__name__}: {' '.join(str(exc).split())}"}
    result["allocator"] = args.allocator
    _emit(result)
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main())
