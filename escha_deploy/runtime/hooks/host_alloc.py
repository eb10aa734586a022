"""HiCache host allocator choice: cudaHostRegister'ed mmap (stock) or cudaHostAlloc.

escha-deploy runtime hook (capability ``hicache-host-allocator``). Patch
``runtime_patches/0002-hicache-host-allocator.patch`` copies this file byte for byte into
``sglang/srt/mem_cache/pool_host/escha_host_alloc.py``; SGLang's ``pool_host/common.py`` calls
``choose`` and ``alloc_pinned`` from its CUDA allocation function; the pools' ``destroy()``
leaves a buffer of ``alloc_pinned`` alone (it carries no cudaHostRegister ranges), and the block
is freed when the last tensor viewing it dies. Standard library only at
import time: torch is imported inside ``alloc_pinned``, and the device attribute is read
through the CUDA driver and host memory allocated through the CUDA runtime, both with ctypes.

``ESCHA_HICACHE_HOST_ALLOCATOR``:

- ``register``: the stock SGLang 0.5.19 path (``common.py: alloc_with_host_register``): an
  anonymous mmap, pre-faulted, then ``cudaHostRegister(ptr, size, 0)``.
- ``pinned``: ``cudaHostAlloc`` of exactly the requested bytes (``alloc_pinned``: libcudart
  through ctypes, wrapped as a tensor with ``torch.frombuffer``), whose device alias is the host
  address (sglang#35233: the fix for WSL2's illegal memory access). Not
  ``torch.empty(..., pin_memory=True)``: torch's CachingHostAllocator rounds every block up to a
  power of two (``aten/src/ATen/core/CachingHostAllocator.h``), so a 2.15 GB pool would pin
  4.29 GB. Freed with ``cudaFreeHost`` when the last tensor viewing it dies, not at the pool's
  ``destroy()``: SGLang keeps views of a pool's buffers after it (``alloc_pinned``).
- ``auto`` (default): ``pinned`` when the CUDA device attribute
  CanUseHostPointerForRegisteredMem is 0 (WSL2: a kernel cannot use the host address of
  registered memory, and SGLang's transfer kernels pass exactly that address), else
  ``register``.

Whenever the choice is ``pinned``, each allocation must stay within ``PINNED_MAX_BYTES`` (4 GiB,
sglang#7666: one pinned allocation above about 4 GB failed with "CUDA error:
invalid argument"); a larger buffer is refused with ``PinnedAllocationTooLarge`` naming its
size, before anything is allocated. Lower ``--hicache-ratio`` (or ``--hicache-size``) to fit.
"""

from __future__ import annotations

import ctypes
import os
import weakref
from typing import Any, Optional

ENV_HOST_ALLOCATOR = "ESCHA_HICACHE_HOST_ALLOCATOR"
CHOICES = ("auto", "register", "pinned")
#: Largest single pinned (cudaHostAlloc) allocation we make: 4 GiB (sglang#7666).
PINNED_MAX_BYTES = 4 * (1024**3)
#: CUDA driver enum CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM (cuda.h), the
#: same value as the runtime's cudaDevAttrCanUseHostPointerForRegisteredMem.
CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM = 91

#: The attribute the stock unregister path reads (``common.py``); an empty list tells it that
#: this buffer holds no cudaHostRegister ranges, so ``destroy()`` does not unregister it.
_REGISTERED_RANGES_ATTR = "_sglang_cuda_host_registered_ranges"
#: The attribute ``alloc_pinned`` sets on its tensor: its block's finalizer (``pinned_block``),
#: which runs ``cudaFreeHost`` once, when the last tensor viewing the block dies.
_PINNED_FREE_ATTR = "_escha_cuda_host_free"
#: cudaHostAllocDefault (cuda_runtime_api.h), the flags torch's own pinned allocator passes; with
#: unified addressing the block is mapped and its device alias is its host address.
CUDA_HOST_ALLOC_DEFAULT = 0

#: The unit the kernel pins memory in (the x86_64 base page, 4 KiB): both allocators pin whole
#: pages, so a request of ``n`` bytes pins ``n`` rounded up to it (``pinned_bytes``).
PAGE_BYTES = 4096

#: Where each allocator's pinned bytes come from, for ``plan``'s per-buffer lines.
PINNED_BYTES_SOURCE = {
    "pinned": "cudaHostAlloc of the exact size (escha_host_alloc.alloc_pinned, not torch's caching "
              "host allocator), whole 4 KiB pages",
    "register": "mmap of the exact size + cudaHostRegister (pool_host/common.py: "
                "alloc_with_host_register), whole 4 KiB pages",
}


class HostAllocatorError(ValueError):
    """``ESCHA_HICACHE_HOST_ALLOCATOR`` is not one of auto, register, pinned."""


class PinnedAllocationTooLarge(ValueError):
    """A pinned (cudaHostAlloc) host buffer would exceed ``PINNED_MAX_BYTES``."""


def parse_choice(value: Optional[str]) -> str:
    """``auto`` for unset/empty, else the value lower-cased if it is a known choice.

    Raises ``HostAllocatorError`` naming the variable and the choices otherwise.
    """
    if value is None or value.strip() == "":
        return "auto"
    choice = value.strip().lower()
    if choice not in CHOICES:
        raise HostAllocatorError(
            f"{ENV_HOST_ALLOCATOR}={value!r} is not one of {', '.join(CHOICES)}"
        )
    return choice


def registered_memory_device_mappable(device_index: int = 0) -> Optional[bool]:
    """CanUseHostPointerForRegisteredMem of CUDA device ``device_index`` as a bool.

    Read with the CUDA driver API (``libcuda.so.1``: ``cuInit``, ``cuDeviceGet``,
    ``cuDeviceGetAttribute``). ``None`` when the driver or device cannot be queried (no CUDA);
    ``auto`` then keeps the stock path.
    """
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    value = ctypes.c_int(0)
    dev = ctypes.c_int(0)
    if cuda.cuInit(0) != 0:
        return None
    if cuda.cuDeviceGet(ctypes.byref(dev), int(device_index)) != 0:
        return None
    rc = cuda.cuDeviceGetAttribute(
        ctypes.byref(value),
        CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM,
        dev,
    )
    if rc != 0:
        return None
    return bool(value.value)


def resolve(choice: str, mappable: Optional[bool], nbytes: int, what: str = "host pool") -> str:
    """``register`` or ``pinned`` for one buffer of ``nbytes`` bytes. Pure.

    ``choice`` from ``parse_choice``; ``mappable`` from ``registered_memory_device_mappable``
    (``None`` = unknown, which keeps ``register`` under ``auto``). Raises
    ``PinnedAllocationTooLarge`` when the answer is ``pinned`` and ``nbytes`` exceeds
    ``PINNED_MAX_BYTES``.
    """
    if choice == "register":
        return "register"
    if choice == "auto" and mappable is not False:
        return "register"
    if nbytes > PINNED_MAX_BYTES:
        why = (
            "ESCHA_HICACHE_HOST_ALLOCATOR=pinned"
            if choice == "pinned"
            else "auto chose pinned: CanUseHostPointerForRegisteredMem is 0 (WSL2)"
        )
        raise PinnedAllocationTooLarge(
            f"{what}: one pinned (cudaHostAlloc) buffer of {nbytes} B "
            f"({nbytes / 2**30:.2f} GiB) exceeds the safe {PINNED_MAX_BYTES} B (4 GiB, "
            f"sglang#7666) [{why}]; lower --hicache-ratio or --hicache-size"
        )
    return "pinned"


def choose(nbytes: int, what: str = "host pool", device_index: int = 0,
           environ: Optional[dict] = None) -> str:
    """``resolve`` with the choice read from the environment and the device attribute probed
    only when ``auto`` needs it."""
    env = os.environ if environ is None else environ
    choice = parse_choice(env.get(ENV_HOST_ALLOCATOR))
    mappable = registered_memory_device_mappable(device_index) if choice == "auto" else None
    return resolve(choice, mappable, nbytes, what)


def pinned_bytes(nbytes: int, allocator: str) -> int:
    """Bytes ``allocator`` (``pinned`` or ``register``; ``auto`` resolves to one of them, both
    pin alike) pins for one request of ``nbytes`` bytes: ``nbytes`` rounded up to
    ``PAGE_BYTES``. Pure; the rule the planner counts with (``planner/pools.py``).

    ``pinned``: one cudaHostAlloc of exactly ``nbytes`` (``alloc_pinned``); ``register``: an
    anonymous mmap of ``nbytes``, registered whole (``common.py: _cuda_host_register``).
    """
    if allocator not in CHOICES:
        raise HostAllocatorError(f"allocator {allocator!r} is not one of {', '.join(CHOICES)}")
    if nbytes <= 0:
        return 0
    return -(-int(nbytes) // PAGE_BYTES) * PAGE_BYTES


_CUDART: Any = None


def _loaded_cudart_path() -> Optional[str]:
    """The libcudart this process has mapped (torch's), from ``/proc/self/maps``; ``None`` if none."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                parts = line.split(None, 5)
                if len(parts) == 6 and "/libcudart.so" in parts[5]:
                    return parts[5].strip()
    except OSError:
        return None
    return None


def cudart() -> Any:
    """The CUDA runtime library (ctypes) with ``cudaHostAlloc``, ``cudaFreeHost``,
    ``cudaGetLastError``, ``cudaPeekAtLastError`` and ``cudaGetErrorString`` typed: the copy
    torch loaded (CUDA initialised first), so the allocation lives in torch's CUDA context; else
    the first of ``libcudart.so.13``, ``.so.12``, ``.so`` that loads. Raises ``OSError`` when
    none does. Cached in ``_CUDART``, the one seam through which ``pinned_block`` reaches CUDA."""
    global _CUDART
    if _CUDART is not None:
        return _CUDART
    import torch

    torch.cuda.init()
    candidates = [p for p in (_loaded_cudart_path(),) if p] + ["libcudart.so.13", "libcudart.so.12", "libcudart.so"]
    errors = []
    for name in candidates:
        try:
            lib = ctypes.CDLL(name)
        except OSError as exc:
            errors.append(str(exc))
            continue
        lib.cudaHostAlloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_uint]
        lib.cudaHostAlloc.restype = ctypes.c_int
        lib.cudaFreeHost.argtypes = [ctypes.c_void_p]
        lib.cudaFreeHost.restype = ctypes.c_int
        lib.cudaGetLastError.argtypes = []
        lib.cudaGetLastError.restype = ctypes.c_int
        lib.cudaPeekAtLastError.argtypes = []
        lib.cudaPeekAtLastError.restype = ctypes.c_int
        lib.cudaGetErrorString.argtypes = [ctypes.c_int]
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        _CUDART = lib
        return lib
    raise OSError("no CUDA runtime library (libcudart) could be loaded: " + "; ".join(errors))


def _error_name(lib: Any, rc: int) -> str:
    why = lib.cudaGetErrorString(rc)
    return why.decode(errors="replace") if why else "unknown"


def _free_host(lib: Any, ptr: int) -> None:
    """The finalizer of a ``pinned_block``: ``cudaFreeHost``, then the thread's last CUDA error
    cleared (``cudaGetLastError``) so that a failed free is not reported by torch's next launch
    check. Never raises: it runs from a storage deleter."""
    if int(lib.cudaFreeHost(ctypes.c_void_p(ptr))) != 0:
        lib.cudaGetLastError()


def pinned_block(nbytes: int) -> Any:
    """ONE ``cudaHostAlloc`` of exactly ``nbytes`` bytes (``CUDA_HOST_ALLOC_DEFAULT`` flags, as
    torch's own pinned allocator passes), as a ctypes ``c_uint8`` array over the returned
    address: an object with the buffer protocol that owns the block.

    The block is freed by ``cudaFreeHost`` once, when this object is garbage: a
    ``weakref.finalize`` on it (``atexit`` off: at interpreter exit the process's pinned memory
    goes with it, and torch's CUDA context may already be gone). Whoever views the memory through
    the buffer protocol (``torch.frombuffer``, ``memoryview``, numpy) holds a reference to it, so
    the block outlives every such view; nothing else frees it. Its ``finalizer`` attribute is that
    ``weakref.finalize`` (``alive`` is ``False`` once the block is freed).

    A failed ``cudaHostAlloc`` sets the CUDA runtime's last error of this thread, which torch's
    next kernel-launch check (``C10_CUDA_KERNEL_LAUNCH_CHECK``: ``cudaGetLastError``) would report
    as its own failure; it is cleared here (``cudaGetLastError``) before ``RuntimeError`` is raised
    naming the size and the CUDA error, and the message says so if the error is sticky
    (``cudaPeekAtLastError`` still non-zero: the context is unusable).
    """
    lib = cudart()
    ptr = ctypes.c_void_p()
    rc = int(lib.cudaHostAlloc(ctypes.byref(ptr), ctypes.c_size_t(nbytes), CUDA_HOST_ALLOC_DEFAULT))
    if rc != 0 or not ptr.value:
        lib.cudaGetLastError()  # clears a non-sticky error (cudaErrorMemoryAllocation is one)
        left = int(lib.cudaPeekAtLastError())
        sticky = f"; the CUDA context is left in error {left} ({_error_name(lib, left)})" if left else ""
        raise RuntimeError(f"cudaHostAlloc of {nbytes} B failed (rc={rc}, {_error_name(lib, rc)}){sticky}")
    block_type = type("EschaPinnedHostBlock", (ctypes.c_uint8 * nbytes,), {})
    block = block_type.from_address(ptr.value)
    free = weakref.finalize(block, _free_host, lib, ptr.value)
    free.atexit = False
    block.finalizer = free  # a weak reference back: the finalizer does not keep the block alive
    return block


def alloc_pinned(dims: tuple, dtype: Any) -> Any:
    """A page-locked host tensor of shape ``dims`` and ``dtype`` over one ``pinned_block`` of
    exactly ``prod(dims) x itemsize`` bytes: no caching allocator, so no power-of-two rounding.

    Lifetime: ``torch.frombuffer`` keeps a reference to the block in the tensor storage's
    deleter (``torch/csrc/utils/tensor_new.cpp: tensor_frombuffer``: ``Py_INCREF`` of the
    exporter, ``Py_DECREF`` in the ``at::for_blob`` deleter), and every view (``view``, slices,
    ``temporal_buffer[layer_id]``) shares that storage. So the block is freed when the last
    tensor viewing its memory dies, never before: SGLang 0.5.19 keeps views after a pool's
    ``destroy()`` (``pool_host/mamba.py``: ``temporal_buffer`` and ``conv_buffer`` stay
    attributes of the pool; the MHA pool's per-layer views), and an explicit free there
    let a later read fault (SIGSEGV). ``destroy()`` drops only the pool's reference
    (``base.py: HostKVCache.destroy`` sets ``kv_buffer`` to ``None``). Public API on both torch
    2.11 and 2.13; ``torch.from_blob`` with a deleter is not exposed to Python, and a DLPack
    capsule would need its C structs written by hand.

    The tensor carries an empty registered-range list, so SGLang's ``destroy()``
    (``common.py: _cuda_host_unregister``) returns without a cudaHostUnregister of memory it did
    not register, and ``_escha_cuda_host_free``: the block's finalizer (``.alive`` is ``False``
    once it has run), which also marks a buffer this hook made. Raises ``RuntimeError`` naming the
    CUDA error when the allocation fails (``pinned_block``).
    """
    import torch

    itemsize = torch.empty((), dtype=dtype).element_size()
    nbytes = itemsize
    for d in dims:
        nbytes *= int(d)
    if nbytes == 0:
        buffer = torch.empty(dims, dtype=dtype, device="cpu")
        setattr(buffer, _REGISTERED_RANGES_ATTR, [])
        return buffer
    block = pinned_block(nbytes)
    buffer = torch.frombuffer(block, dtype=torch.uint8).view(dtype).view(dims)
    setattr(buffer, _REGISTERED_RANGES_ATTR, [])
    setattr(buffer, _PINNED_FREE_ATTR, block.finalizer)
    return buffer

