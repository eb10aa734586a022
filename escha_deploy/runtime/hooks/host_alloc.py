"""HiCache host allocator choice: cudaHostRegister'ed mmap (stock) or cudaHostAlloc.

escha-deploy runtime hook (capability ``hicache-host-allocator``). Patch
``runtime_patches/0002-hicache-host-allocator.patch`` copies this file byte for byte into
``sglang/srt/mem_cache/pool_host/escha_host_alloc.py``; SGLang's ``pool_host/common.py`` calls
``choose`` and ``alloc_pinned`` from its CUDA allocation function. Standard library only at
import time: torch is imported inside ``alloc_pinned``, and the device attribute is read
through the CUDA driver with ctypes.

``ESCHA_HICACHE_HOST_ALLOCATOR``:

- ``register``: the stock SGLang 0.5.19 path (``common.py: alloc_with_host_register``): an
  anonymous mmap, pre-faulted, then ``cudaHostRegister(ptr, size, 0)``.
- ``pinned``: ``torch.empty(..., pin_memory=True)``, i.e. ``cudaHostAlloc``, whose device alias
  is the host address (sglang#35233: the fix for WSL2's illegal memory access).
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
from typing import Any, Optional

ENV_HOST_ALLOCATOR = "ESCHA_HICACHE_HOST_ALLOCATOR"
CHOICES = ("auto", "register", "pinned")
#: Largest single pinned (cudaHostAlloc) allocation we make: 4 GiB (sglang#7666).
PINNED_MAX_BYTES = 4 * (1024**3)
#: CUDA driver enum CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM (cuda.h), the
#: same value as the runtime's cudaDevAttrCanUseHostPointerForRegisteredMem.
CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM = 91

#: The attribute the stock unregister path reads (``common.py``); an empty list tells it that
#: this buffer holds no cudaHostRegister ranges, so ``destroy()`` leaves it to torch.
_REGISTERED_RANGES_ATTR = "_sglang_cuda_host_registered_ranges"


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


def alloc_pinned(dims: tuple, dtype: Any) -> Any:
    """A page-locked host tensor from ``cudaHostAlloc`` (torch ``pin_memory=True``), as SGLang's
    own ``common.py: alloc_with_pin_memory`` makes for npu/musa (``torch.empty``).

    Marked with an empty registered-range list, so SGLang's ``destroy()`` does not call
    cudaHostUnregister on memory it did not register.
    """
    import torch

    buffer = torch.empty(dims, dtype=dtype, device="cpu", pin_memory=True)
    setattr(buffer, _REGISTERED_RANGES_ATTR, [])
    return buffer
