"""Two real TP ranks, one GPU each: do both size their HiCache host pools from the same reading?

Run on a machine with 2 GPUs: ``python scripts/two_rank_host_reading.py --pool-gib 8``. Prints
one JSON object. What it does, per rank (torch.distributed: an NCCL world group like SGLang's,
plus a gloo CPU group as SGLang's TP CPU group, which the patch's all-reduce uses):

1. both ranks call the patch's ``snapshot_available`` (``escha_deploy/runtime/hooks/
   host_reserve.py``, the code patch 0001 copies into SGLang) with MemAvailable as the reader:
   one MIN all-reduce gives ``A0``;
2. rank 0 pins a real host pool of ``--pool-gib`` GiB (torch pinned memory, cudaHostAlloc)
   before rank 1 checks, the late-rank ordering of sglang#38156;
3. rank 1 then reads MemAvailable afresh, as stock 0.5.19's ``host_memory_budget_bytes`` does
   at every pool, and both ranks compute the patched budget from ``A0``.

Pass: both ranks report the same ``A0``, and rank 1's patched budget equals rank 0's although
its fresh (stock) reading fell by about the pool rank 0 pinned. Bytes are ints; GiB = 2**30.

Each rank also records MemTotal at both readings. On a VM whose memory grows as it is used
(hot-plugged or ballooned), MemTotal can rise during the reading and hide the pool's drop:
``--touch-gib N`` fills and frees N GiB of pageable memory before the ranks start, so the
readings are taken after memory has been touched. ``tests/runtime/test_two_rank_host_reading.py``
(marked ``gpu``, needs 2 CUDA devices) runs ``run_reading`` and checks what the readings show.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GiB = 2**30


def _meminfo(key: str) -> int:
    """One ``/proc/meminfo`` field in bytes (the file gives kB = 1024 bytes)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} in /proc/meminfo")


def mem_available() -> int:
    """MemAvailable in bytes (what psutil.virtual_memory().available reads on Linux)."""
    return _meminfo("MemAvailable")


def mem_total() -> int:
    """MemTotal in bytes (what psutil.virtual_memory().total reads on Linux)."""
    return _meminfo("MemTotal")


def touch_memory(gib: float) -> None:
    """Fill ``gib`` GiB of pageable host memory (torch, every page written), then free it."""
    if gib <= 0:
        return
    import torch

    buf = torch.empty(int(gib * GiB), dtype=torch.uint8)
    buf.fill_(1)
    del buf


def rank_main(rank: int, world: int, port: int, pool_gib: float, out: str, cpu: bool) -> None:
    import torch
    import torch.distributed as dist

    from escha_deploy.runtime.hooks import host_reserve

    if not cpu:
        torch.cuda.set_device(rank)
    dist.init_process_group("gloo" if cpu else "nccl", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=world)
    cpu_group = dist.new_group(list(range(world)), backend="gloo")
    host_reserve.reset()
    total_first = mem_total()
    first_read = mem_available()
    a0 = host_reserve.snapshot_available(lambda: first_read, group=cpu_group)
    pool = None
    if rank == 0:
        pool = torch.empty(int(pool_gib * GiB), dtype=torch.uint8, pin_memory=not cpu)
        pool.fill_(1)  # touch every page
    dist.barrier(group=cpu_group)  # rank 1 checks only after rank 0 has pinned
    fresh = mem_available()
    total_fresh = mem_total()
    reserve = 10 * GiB
    patched = host_reserve.budget_bytes(mem_available, world, group=cpu_group, reserve=reserve)
    stock = (fresh - reserve) // world  # pool_host/base.py: host_memory_budget_bytes()
    result = {"rank": rank, "device": "cpu" if cpu else torch.cuda.get_device_name(rank), "first_read": first_read,
              "a0": a0, "fresh_read_after_peer_pinned": fresh, "patched_budget": patched,
              "stock_budget": stock, "pinned_here": 0 if pool is None else pool.numel(),
              "reserve": reserve, "mem_total_first": total_first, "mem_total_fresh": total_fresh}
    Path(out).with_suffix(f".rank{rank}.json").write_text(json.dumps(result))
    dist.barrier(group=cpu_group)
    dist.destroy_process_group()


def run_reading(pool_gib: float, out: str, cpu: bool = False, touch_gib: float = 0.0,
                timeout_s: float = 300.0) -> dict:
    """Run both ranks (two processes of this script) and collect their readings.

    ``pool_gib``: the pool rank 0 pins (GiB = 2**30); ``out``: path stem of the per-rank JSON
    files; ``touch_gib``: pageable GiB filled and freed first (``touch_memory``). Returns
    ``{"ok", "exit_codes", "seconds", "pool_gib", "touched_gib", "ranks"}``, ``ranks`` a list of
    the two ranks' dicts (bytes as ints) or ``None`` for a rank that wrote nothing.
    """
    import subprocess

    touch_memory(touch_gib)
    for r in range(2):
        Path(out).with_suffix(f".rank{r}.json").unlink(missing_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    procs = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), "--port", str(port),
                               "--pool-gib", str(pool_gib), "--out", out, *(["--cpu"] if cpu else [])])
             for r in range(2)]
    try:
        codes = [p.wait(timeout=timeout_s) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    ranks = []
    for r in range(2):
        f = Path(out).with_suffix(f".rank{r}.json")
        ranks.append(json.loads(f.read_text()) if f.exists() else None)
    ok = all(c == 0 for c in codes) and all(ranks) and ranks[0]["a0"] == ranks[1]["a0"] \
        and ranks[0]["patched_budget"] == ranks[1]["patched_budget"]
    return {"ok": ok, "exit_codes": codes, "seconds": round(time.monotonic() - t0, 2),
            "pool_gib": pool_gib, "touched_gib": touch_gib, "ranks": ranks}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pool-gib", type=float, default=8.0, help="host pool rank 0 pins first (GiB)")
    ap.add_argument("--touch-gib", type=float, default=0.0,
                    help="pageable memory to fill and free before the readings (GiB)")
    ap.add_argument("--out", default="/tmp/two_rank_host_reading")
    ap.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--cpu", action="store_true",
                    help="check the script on a CPU machine (gloo only, pageable memory)")
    a = ap.parse_args()
    if a.rank is not None:
        rank_main(a.rank, 2, a.port, a.pool_gib, a.out, a.cpu)
        return 0
    result = run_reading(a.pool_gib, a.out, cpu=a.cpu, touch_gib=a.touch_gib)
    print(json.dumps(result, indent=1))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
