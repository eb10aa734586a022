"""Kernel store into the host memory each allocator choice returns (run on a CUDA machine).

    python tests/runtime/gpu_store_check.py            # markdown table + environment
    python tests/runtime/gpu_store_check.py --json     # one JSON object (the GPU test reads it)

Cases, each in its own child process (a store into pageable memory can kill the CUDA context):

- ``register``: SGLang 0.5.19's stock path rebuilt with the same calls
  (``storage/mmap: alloc_mmap``: anonymous ``MAP_SHARED`` mmap, pre-faulted; then
  ``common.py: _cuda_host_register``: ``torch.cuda.cudart().cudaHostRegister(ptr, size, 0)``);
- ``pinned``: ``escha_deploy.runtime.hooks.host_alloc.alloc_pinned`` (cudaHostAlloc);
- ``auto``: ``host_alloc.choose`` on this device, then the chosen one;
- ``pageable``: plain ``torch.empty`` on the CPU, the negative case.

The store is a CuPy raw kernel that writes ``(i * 7 + 3) & 0xff`` to byte ``i`` through the
*host* address (what SGLang's transfer kernels are given), then the host reads it back.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

NBYTES = 64 * 2**20
CASES = ("register", "pinned", "auto", "pageable")
_REPO = Path(__file__).resolve().parents[2]

_KERNEL = r"""
extern "C" __global__ void store(unsigned long long addr, unsigned long long n) {
    unsigned char* p = (unsigned char*)addr;
    for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        p[i] = (unsigned char)((i * 7 + 3) & 0xff);
    }
}
"""


def _alloc_register(torch, n):
    import mmap

    mm = mmap.mmap(-1, n, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS,
                   prot=mmap.PROT_READ | mmap.PROT_WRITE)
    if hasattr(mmap, "MADV_POPULATE_WRITE"):
        mm.madvise(mmap.MADV_POPULATE_WRITE)
    t = torch.frombuffer(mm, dtype=torch.uint8)
    rc = int(torch.cuda.cudart().cudaHostRegister(t.data_ptr(), n, 0))
    if rc != 0:
        raise RuntimeError(f"cudaHostRegister rc={rc}")
    return t, mm


def _one(case: str) -> dict:
    import cupy
    import numpy as np
    import torch

    sys.path.insert(0, str(_REPO))
    from escha_deploy.runtime.hooks import host_alloc

    torch.cuda.init()
    out: dict = {"case": case, "mappable": host_alloc.registered_memory_device_mappable(0)}
    keep = None
    chosen = case
    if case == "auto":
        chosen = host_alloc.choose(NBYTES, environ={})
        out["chosen"] = chosen
    if chosen == "register":
        t, keep = _alloc_register(torch, NBYTES)
    elif chosen == "pinned":
        t = host_alloc.alloc_pinned((NBYTES,), torch.uint8)
        out["is_pinned"] = bool(t.is_pinned())
    else:
        t = torch.empty((NBYTES,), dtype=torch.uint8)
    t.zero_()
    kern = cupy.RawKernel(_KERNEL, "store")
    kern((256,), (256,), (np.uint64(t.data_ptr()), np.uint64(NBYTES)))
    cupy.cuda.runtime.deviceSynchronize()
    got = t.numpy()
    want = ((np.arange(NBYTES, dtype=np.uint64) * 7 + 3) & 0xFF).astype(np.uint8)
    out["ok"] = bool(np.array_equal(got, want))
    if not out["ok"]:
        out["error"] = f"kernel ran but {int((got != want).sum())} bytes differ"
    del keep
    return out


def run_all() -> list[dict]:
    """Each case in a child process; a crash becomes ``ok: False`` with its last error line."""
    rows = []
    for case in CASES:
        proc = subprocess.run([sys.executable, __file__, "--case", case], capture_output=True,
                              text=True, timeout=300)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if proc.returncode == 0 and lines:
            rows.append(json.loads(lines[-1]))
        else:
            err = (proc.stderr.strip().splitlines() or ["exit %d" % proc.returncode])[-1]
            rows.append({"case": case, "ok": False, "error": err[:300]})
    return rows


def environment() -> dict:
    import torch

    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    return {"gpu_driver": smi, "torch": torch.__version__, "cuda": torch.version.cuda}


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--case":
        print(json.dumps(_one(sys.argv[2])))
        sys.exit(0)
    rows = run_all()
    if "--json" in sys.argv:
        print(json.dumps({"environment": environment(), "rows": rows}))
        sys.exit(0)
    print(json.dumps(environment()))
    print("| case | kernel store | detail |\n|---|---|---|")
    for r in rows:
        detail = r.get("error") or ", ".join(f"{k}={r[k]}" for k in ("mappable", "chosen", "is_pinned") if k in r)
        print(f"| {r['case']} | {'ok' if r['ok'] else 'FAILED'} | {detail} |")
