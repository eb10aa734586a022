"""Host-mapped store probe, one case per process: can a GPU kernel store into this memory?

Run as ``python -m escha_deploy.doctor.store_probe --case CASE [--method cupy|torch]``; it
prints one JSON line ``{"case", "ok", "error", "method", "attributes"}`` on stdout (plus
``"ran": false`` when the case could not run here: torch or numpy missing, or no CUDA device
visible to torch) and exits 0 even when the store failed (a crash or a hang is the parent's to report). Each case runs in its
own process because an illegal memory access leaves the CUDA context unusable.

Cases (``CASES``):

- ``device``: ``torch.empty(..., device="cuda")`` (cudaMalloc through torch's allocator).
- ``torch_pinned``: ``torch.empty(..., pin_memory=True)`` (cudaHostAlloc); the device alias
  equals the host address on every platform (sglang#40232).
- ``host_register_flags_N`` for N = 0..3: an anonymous ``MAP_SHARED`` mmap, pre-faulted, then
  ``cudaHostRegister(ptr, size, N)`` (0 default, 1 portable, 2 mapped, 3 both). This is SGLang
  0.5.19's host-pool path (``mem_cache/pool_host/common.py`` ``_cuda_host_register`` uses flags
  0 on an mmap from ``storage/mmap/mmap_allocator.py``).
- ``pageable``: the same mmap, not registered. Expected to fail everywhere without HMM.

The kernel is given the raw host address, as SGLang's HiCache transfer kernels are. Where
``cudaDevAttrCanUseHostPointerForRegisteredMem`` is 0 (WSL2 GPU-PV) the registered cases fail
with an illegal address: the seed's crash (sglang#40232, sglang#35233).

Methods: ``cupy`` launches a raw CUDA kernel that stores ``i ^ 0x5A5A5A5A`` into word ``i``;
``torch`` wraps the address as a CUDA tensor through ``__cuda_array_interface__`` and runs
``fill_`` (torch refuses a pageable pointer before any kernel runs). ``auto`` is cupy when
importable, else torch. The result is checked by reading the memory back on the host.

Stdlib only at module level: this runs inside images that may lack escha-deploy's deps.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import sys

CASES = (
    "device",
    "torch_pinned",
    "host_register_flags_0",
    "host_register_flags_1",
    "host_register_flags_2",
    "host_register_flags_3",
    "pageable",
)

#: Words stored per case: 1 Mi uint32 = 4 MiB, several pages and kernel blocks.
N_WORDS = 1 << 20
PATTERN = 0x5A5A5A5A

#: cudaDeviceAttr numbers (CUDA runtime ``driver_types.h``), read through CuPy when present.
ATTRIBUTES = {
    "CanMapHostMemory": 19,
    "PageableMemoryAccess": 88,
    "ConcurrentManagedAccess": 89,
    "CanUseHostPointerForRegisteredMem": 91,
    "HostRegisterSupported": 99,
    "PageableMemoryAccessUsesHostPageTables": 100,
}

_KERNEL = r"""
extern "C" __global__ void escha_store(unsigned long long addr, unsigned int n, unsigned int pattern) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) ((unsigned int*)addr)[i] = i ^ pattern;
}
"""


def _expected():
    import numpy as np

    return np.arange(N_WORDS, dtype=np.uint32) ^ np.uint32(PATTERN)


def _store_cupy(ptr: int) -> None:
    import cupy

    kernel = cupy.RawKernel(_KERNEL, "escha_store")
    threads = 256
    kernel(((N_WORDS + threads - 1) // threads,), (threads,),
           (cupy.uint64(ptr), cupy.uint32(N_WORDS), cupy.uint32(PATTERN)))
    cupy.cuda.runtime.deviceSynchronize()


class _CudaArray:
    """A bare ``__cuda_array_interface__`` (v3) over ``ptr``: ``N_WORDS`` uint32."""

    def __init__(self, ptr: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (N_WORDS,), "typestr": "<u4", "data": (ptr, False), "version": 3,
        }


def _store_torch(ptr: int) -> None:
    import torch

    t = torch.as_tensor(_CudaArray(ptr), device="cuda").view(torch.int32)
    idx = torch.arange(N_WORDS, device="cuda", dtype=torch.int32)
    # An elementwise kernel writing through ``out`` (a plain copy_ could become a DMA copy).
    # PATTERN < 2**31 and i < 2**20, so int32 holds every value.
    torch.bitwise_xor(idx, PATTERN, out=t)
    torch.cuda.synchronize()


def _attributes() -> dict[str, int]:
    try:
        import cupy
    except ImportError:
        return {}
    out = {}
    for name, num in ATTRIBUTES.items():
        try:
            out[name] = int(cupy.cuda.runtime.deviceGetAttribute(num, 0))
        except Exception:  # an attribute the runtime does not know
            continue
    return out


def _mmap_prefaulted(nbytes: int) -> mmap.mmap:
    mm = mmap.mmap(-1, nbytes, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS,
                   prot=mmap.PROT_READ | mmap.PROT_WRITE)
    mm.write(b"\0" * nbytes)  # fault every page in, as SGLang's MAP_POPULATE does
    mm.seek(0)
    return mm


def run_case(case: str, method: str) -> dict:
    """Run one case in this process; returns the JSON-able result."""
    import torch

    if not torch.cuda.is_available():
        return {"case": case, "ok": False, "ran": False, "error": "no CUDA device visible to torch", "method": method}
    import numpy as np
    torch.cuda.init()
    store = _store_cupy if method == "cupy" else _store_torch
    nbytes = N_WORDS * 4
    keep = []  # buffers must outlive the store
    if case == "device":
        buf = torch.zeros(N_WORDS, dtype=torch.int32, device="cuda")
        keep.append(buf)
        store(buf.data_ptr())
        got = buf.cpu().numpy().view(np.uint32)
    elif case == "torch_pinned":
        buf = torch.zeros(N_WORDS, dtype=torch.int32, pin_memory=True)
        keep.append(buf)
        store(buf.data_ptr())
        got = buf.numpy().view(np.uint32)
    elif case.startswith("host_register_flags_") or case == "pageable":
        mm = _mmap_prefaulted(nbytes)
        keep.append(mm)
        ptr = ctypes.addressof(ctypes.c_char.from_buffer(mm))
        if case != "pageable":
            flags = int(case.rsplit("_", 1)[1])
            cudart = torch.cuda.cudart()
            rc = int(cudart.cudaHostRegister(ptr, nbytes, flags))
            if rc != 0:
                return {"case": case, "ok": False, "method": method,
                        "error": f"cudaHostRegister(flags={flags}) rc={rc}: {cudart.cudaGetErrorString(rc)}"}
        store(ptr)
        got = np.frombuffer(mm, dtype=np.uint32, count=N_WORDS)
    else:
        raise SystemExit(f"unknown case {case!r}; choose from {', '.join(CASES)}")
    bad = int(np.count_nonzero(got != _expected()))
    if bad:
        return {"case": case, "ok": False, "method": method,
                "error": f"kernel returned but {bad} of {N_WORDS} words differ on the host"}
    return {"case": case, "ok": True, "error": None, "method": method}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m escha_deploy.doctor.store_probe",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--case", required=True, choices=CASES)
    parser.add_argument("--method", default="auto", choices=("auto", "cupy", "torch"))
    args = parser.parse_args(argv)
    method = args.method
    if method == "auto":
        try:
            import cupy  # noqa: F401

            method = "cupy"
        except ImportError:
            method = "torch"
    try:
        result = run_case(args.case, method)
    except ImportError as exc:  # torch or numpy absent: the probe did not run (unknown, not failed)
        result = {"case": args.case, "ok": False, "ran": False, "method": method,
                  "error": f"{type(exc).__name__}: {exc}"}
    except Exception as exc:  # the probe's answer, not a bug: report it
        msg = " ".join(str(exc).split()) or type(exc).__name__
        result = {"case": args.case, "ok": False, "method": method, "error": f"{type(exc).__name__}: {msg}"}
    result["attributes"] = _attributes() if args.case == "device" else {}
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    # A poisoned context can hang or crash in teardown; the answer is already out.
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main())
