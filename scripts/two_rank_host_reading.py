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


def mem_available() -> int:
    """MemAvailable in bytes (what psutil.virtual_memory().available reads on Linux)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


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
    first_read = mem_available()
    a0 = host_reserve.snapshot_available(lambda: first_read, group=cpu_group)
    pool = None
    if rank == 0:
        pool = torch.empty(int(pool_gib * GiB), dtype=torch.uint8, pin_memory=not cpu)
        pool.fill_(1)  # touch every page
    dist.barrier(group=cpu_group)  # rank 1 checks only after rank 0 has pinned
    fresh = mem_available()
    reserve = 10 * GiB
    patched = host_reserve.budget_bytes(mem_available, world, group=cpu_group, reserve=reserve)
    stock = (fresh - reserve) // world  # pool_host/base.py: host_memory_budget_bytes()
    result = {"rank": rank, "device": "cpu" if cpu else torch.cuda.get_device_name(rank), "first_read": first_read,
              "a0": a0, "fresh_read_after_peer_pinned": fresh, "patched_budget": patched,
              "stock_budget": stock, "pinned_here": 0 if pool is None else pool.numel()}
    Path(out).with_suffix(f".rank{rank}.json").write_text(json.dumps(result))
    dist.barrier(group=cpu_group)
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pool-gib", type=float, default=8.0, help="host pool rank 0 pins first (GiB)")
    ap.add_argument("--out", default="/tmp/two_rank_host_reading")
    ap.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--cpu", action="store_true",
                    help="check the script on a CPU machine (gloo only, pageable memory)")
    a = ap.parse_args()
    if a.rank is not None:
        rank_main(a.rank, 2, a.port, a.pool_gib, a.out, a.cpu)
        return 0
    import subprocess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    procs = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), "--port", str(port),
                               "--pool-gib", str(a.pool_gib), "--out", a.out, *(["--cpu"] if a.cpu else [])])
             for r in range(2)]
    codes = [p.wait(timeout=300) for p in procs]
    ranks = []
    for r in range(2):
        f = Path(a.out).with_suffix(f".rank{r}.json")
        ranks.append(json.loads(f.read_text()) if f.exists() else None)
    ok = all(c == 0 for c in codes) and all(ranks) and ranks[0]["a0"] == ranks[1]["a0"] \
        and ranks[0]["patched_budget"] == ranks[1]["patched_budget"]
    print(json.dumps({"ok": ok, "exit_codes": codes, "seconds": round(time.monotonic() - t0, 2),
                      "pool_gib": a.pool_gib, "ranks": ranks}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
