"""A pinned host block's lifetime on a real CUDA GPU (marked ``gpu``; skipped without CUDA).

SGLang 0.5.19 keeps views of a host pool's buffers after the pool's ``destroy()``
(``pool_host/mamba.py``: ``temporal_buffer``/``conv_buffer``; the MHA pool's per-layer views), so
the block ``alloc_pinned`` makes must be freed when the last tensor viewing it dies, not at
``destroy()``; a read after an explicit free there faulted (SIGSEGV). Each job runs in a fresh
process (``tests/runtime/gpu_host_alloc_lifetime.py``), so a fault fails the test, naming the
signal, instead of killing pytest. Needs only torch with CUDA and this checkout; the CPU half
(the free is called, once, after the last view) is ``test_host_alloc_lifetime.py``.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("gpu_host_alloc_lifetime.py")
GiB = 2**30
#: The buffer whose pinned bytes are read from MemAvailable (its noise is tens of MiB).
LIFETIME_BYTES = 2 * GiB
#: Share of the buffer each MemAvailable step must show (the rest is noise from other processes).
SHARE = 0.9


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _job(*args: str) -> dict:
    if not _cuda():
        pytest.skip("no CUDA device")
    r = subprocess.run([sys.executable, str(WORKER), *args], capture_output=True, text=True,
                       cwd=REPO, timeout=300)
    if r.returncode < 0:
        pytest.fail(f"{' '.join(args)}: the process died of {signal.Signals(-r.returncode).name}\n"
                    f"{r.stderr[-4000:]}")
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_memory_returns_when_the_last_view_dies_not_at_destroy():
    out = _job("lifetime", "--bytes", str(LIFETIME_BYTES))
    need = SHARE * LIFETIME_BYTES
    assert out["pinned_at_alloc"] >= need, out
    assert out["still_pinned_after_destroy"] >= need, out     # a view is alive: nothing freed
    assert not out["freed_at_destroy"], out
    assert out["read_after_destroy_ok"], out
    assert out["freed_at_last_view"], out
    assert out["returned_when_last_view_died"] >= need, out


def test_access_after_destroy_does_not_fault():
    out = _job("after-destroy")
    assert out["is_pinned"], out
    assert out["cpu_sum"] == out["device_sum"] > 0, out
    assert out["written_sum"] == out["expected_written_sum"], out


def test_failed_allocation_does_not_break_the_next_cuda_call():
    out = _job("failed-alloc")
    assert out["error"] and out["error"].startswith(f"cudaHostAlloc of {2**50} B failed"), out
    assert out["last_error_after_failure"] == 0, out
    assert out["next_call_error"] is None, out
    assert out["kernel_sum"] == sum(range(1 << 20)) * 2, out
    assert out["pinned_roundtrip_sum"] == 3 * (1 << 20), out
