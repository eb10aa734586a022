"""A pinned block's lifetime, on a CPU machine: ``cudaFreeHost`` runs once, when the last view of
the block dies, and never before; a failed ``cudaHostAlloc`` leaves no CUDA error behind.

No CUDA runtime can run here, so ``FakeCudart`` stands in for libcudart at the hook's one seam
(``host_alloc._CUDART``, what ``cudart()`` returns): host memory from ``ctypes`` buffers, every
free recorded, the thread's last error kept the way the CUDA runtime keeps it (set by a failed
call, returned and reset by ``cudaGetLastError``, returned by ``cudaPeekAtLastError``). Views
are taken through the buffer protocol (``memoryview``), as ``torch.frombuffer`` takes them; the
same lifetime with real tensors and real pinned memory is
``tests/runtime/test_host_alloc_lifetime_gpu.py``.
"""

from __future__ import annotations

import ctypes
import gc

import pytest

from escha_deploy.runtime.hooks import host_alloc as ha

#: cudaErrorMemoryAllocation, cudaErrorIllegalAddress (driver_types.h).
OUT_OF_MEMORY, ILLEGAL_ADDRESS = 2, 700


class FakeCudart:
    """Stand-in for libcudart (no CUDA here), with the calls ``pinned_block`` makes."""

    def __init__(self, fail_with: int = 0, sticky: bool = False):
        self.blocks: dict[int, ctypes.Array] = {}
        self.freed: list[int] = []
        self.last_error = 0
        self.fail_with = fail_with
        self.sticky = sticky

    def cudaHostAlloc(self, pptr, size, flags):  # noqa: N802 (the CUDA name)
        if self.fail_with:
            self.last_error = self.fail_with
            return self.fail_with
        buf = ctypes.create_string_buffer(size.value)
        addr = ctypes.addressof(buf)
        self.blocks[addr] = buf
        pptr._obj.value = addr  # ctypes.byref(c_void_p): the out-parameter
        return 0

    def cudaFreeHost(self, ptr):  # noqa: N802
        addr = ptr.value
        if addr not in self.blocks:
            self.last_error = 1  # cudaErrorInvalidValue: not a block of ours (or freed twice)
            return 1
        del self.blocks[addr]
        self.freed.append(addr)
        return 0

    def cudaGetLastError(self):  # noqa: N802
        err = self.last_error
        if not self.sticky:
            self.last_error = 0
        return err

    def cudaPeekAtLastError(self):  # noqa: N802
        return self.last_error

    def cudaGetErrorString(self, rc):  # noqa: N802
        return {OUT_OF_MEMORY: b"out of memory", ILLEGAL_ADDRESS: b"an illegal memory access was encountered"
                }.get(rc, b"unknown error")


@pytest.fixture
def fake(monkeypatch) -> FakeCudart:
    lib = FakeCudart()
    monkeypatch.setattr(ha, "_CUDART", lib)
    return lib


def test_block_is_freed_once_when_its_last_view_dies(fake):
    block = ha.pinned_block(4096)
    addr = ctypes.addressof(block)
    whole = memoryview(block).cast("B")
    tail = whole[1024:]          # a view of a view, like temporal_buffer[layer_id]
    whole[1024] = 7
    del block, whole             # the pool's destroy(): its own reference goes
    gc.collect()
    assert fake.freed == [], "freed while a view of the block was alive"
    assert tail[0] == 7          # the memory is still there to read
    del tail
    gc.collect()
    assert fake.freed == [addr], "cudaFreeHost was never called after the last view died"
    assert fake.last_error == 0


def test_block_without_views_is_freed_when_dropped(fake):
    block = ha.pinned_block(64)
    addr = ctypes.addressof(block)
    assert block.finalizer.alive
    finalizer = block.finalizer
    del block
    assert fake.freed == [addr]
    assert not finalizer.alive   # and it cannot run twice
    finalizer()
    assert fake.freed == [addr]


def test_failed_free_leaves_no_error_behind(fake):
    block = ha.pinned_block(64)
    fake.blocks.clear()          # the runtime no longer knows it: cudaFreeHost fails
    del block
    assert fake.freed == []
    assert fake.last_error == 0, "a failed cudaFreeHost left the thread's last CUDA error set"


def test_failed_allocation_clears_the_error_and_names_it(monkeypatch):
    lib = FakeCudart(fail_with=OUT_OF_MEMORY)
    monkeypatch.setattr(ha, "_CUDART", lib)
    with pytest.raises(RuntimeError, match=r"cudaHostAlloc of 1125899906842624 B failed \(rc=2, out of memory\)$"):
        ha.pinned_block(2**50)
    assert lib.last_error == 0, "the failed cudaHostAlloc left its error for the next CUDA call"
    assert lib.blocks == {} and lib.freed == []
    lib.fail_with = 0            # the next allocation works
    block = ha.pinned_block(64)
    assert ctypes.addressof(block) in lib.blocks


def test_sticky_error_after_failed_allocation_is_reported(monkeypatch):
    lib = FakeCudart(fail_with=ILLEGAL_ADDRESS, sticky=True)
    monkeypatch.setattr(ha, "_CUDART", lib)
    with pytest.raises(RuntimeError, match="context is left in error 700"):
        ha.pinned_block(64)


def test_tensor_views_keep_the_block_and_the_last_one_frees_it(fake):
    """``alloc_pinned``'s tensor and the views SGLang keeps (a layer, a slice of every layer);
    runs where torch is installed (the GPU machine), with the stand-in runtime still."""
    torch = pytest.importorskip("torch")
    buf = ha.alloc_pinned((4, 256), torch.bfloat16)
    addr = buf.data_ptr()
    finalizer = getattr(buf, ha._PINNED_FREE_ATTR)
    assert getattr(buf, ha._REGISTERED_RANGES_ATTR) == []  # destroy() unregisters nothing
    layer, temporal = buf[3], buf[:, :16]
    buf.fill_(1)
    del buf                      # the pool's destroy(): kv_buffer = None
    gc.collect()
    assert fake.freed == [] and finalizer.alive
    assert float(layer.float().sum()) == 256.0
    del layer
    gc.collect()
    assert fake.freed == []
    del temporal
    gc.collect()
    assert fake.freed == [addr] and not finalizer.alive
