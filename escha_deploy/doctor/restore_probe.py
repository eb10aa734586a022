"""Restore-bandwidth probe: how fast a host-tier hit loads back, on this GPU and its link.

Run as ``python -m escha_deploy.doctor.restore_probe [--bytes N] [--page-bytes P]``. It times a
pinned ``copy_`` both ways between a device tensor and a host buffer from the runtime's own
pinned allocator (``runtime/hooks/host_alloc.py: alloc_pinned``, one cudaHostAlloc of the exact
size): host -> device is the load-back of a HiCache hit (``load_to_device_per_layer``), device ->
host the backup (``backup_from_device_all_layer``). Best of 5 after one warm-up, at ``N``
(default 1 GiB) and at one KV page of ``P`` bytes (default 4 MiB), timed with CUDA events.

The method is named in the answer (``method``): this is a contiguous copy, not SGLang's
``kernel`` io backend, whose gather/scatter kernels need the patched SGLang tree; on an H200
(PCIe Gen5 x16) those kernels moved about the same at 1-2 GiB (docs/runtime.md). GB/s are 1e9
bytes per second. The last stdout line is one JSON object. Stdlib only at module level.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

DEFAULT_BYTES = 2**30
DEFAULT_PAGE_BYTES = 4 * 2**20
METHOD = "pinned copy_ (torch, cudaHostAlloc buffer from the runtime hook)"


def _best_gbps(torch, fn, nbytes: int, repeats: int = 5) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    best = None
    for _ in range(repeats):
        start.record()
        fn()
        end.record()
        end.synchronize()
        ms = start.elapsed_time(end)
        best = ms if best is None else min(best, ms)
    return nbytes / (best / 1e3) / 1e9


def probe(nbytes: int, page_bytes: int) -> dict:
    """Load (host -> device) and backup (device -> host) GB/s at ``nbytes`` and ``page_bytes``."""
    import torch

    from escha_deploy.runtime.hooks.host_alloc import alloc_pinned

    if not torch.cuda.is_available():
        return {"ok": False, "error": "no CUDA device visible to torch"}
    out: dict = {"ok": True, "method": METHOD, "bytes": nbytes, "page_bytes": page_bytes,
                 "device": torch.cuda.get_device_name(0)}
    for label, n in (("", nbytes), ("page_", page_bytes)):
        host = alloc_pinned((n,), torch.uint8)
        dev = torch.empty(n, dtype=torch.uint8, device="cuda")
        try:
            host.fill_(1)
            out[f"{label}load_gbps"] = round(_best_gbps(torch, lambda: dev.copy_(host, non_blocking=True), n), 2)
            out[f"{label}backup_gbps"] = round(_best_gbps(torch, lambda: host.copy_(dev, non_blocking=True), n), 2)
        finally:
            torch.cuda.synchronize()
            del host, dev  # the block is freed with its last tensor (alloc_pinned)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m escha_deploy.doctor.restore_probe",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--bytes", type=int, default=DEFAULT_BYTES, help="bytes of the large copy")
    ap.add_argument("--page-bytes", type=int, default=DEFAULT_PAGE_BYTES, help="bytes of one KV page")
    args = ap.parse_args(argv)
    if args.bytes <= 0 or args.page_bytes <= 0:
        ap.error("--bytes and --page-bytes must be positive byte counts")
    try:
        result = probe(args.bytes, args.page_bytes)
    except Exception as exc:  # the answer, not a crash
        result = {"ok": False, "error": f"{type(exc).__name__}: {' '.join(str(exc).split())}"}
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main())
