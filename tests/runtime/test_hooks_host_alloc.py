"""The host-allocator hook: choice parsing and resolution (pure), the device probe, and on a
CUDA machine a kernel store into the memory each choice returns (skipped, never faked, where
no CUDA device exists)."""

from __future__ import annotations

import pytest

from escha_deploy.sglang.capabilities import ENV_HOST_ALLOCATOR, HOST_ALLOCATOR_CHOICES
from escha_deploy.runtime.hooks import host_alloc as ha

GiB = 2**30


def test_names_match_capabilities():
    assert ha.ENV_HOST_ALLOCATOR == ENV_HOST_ALLOCATOR
    assert ha.CHOICES == HOST_ALLOCATOR_CHOICES


@pytest.mark.parametrize("text, expected", [(None, "auto"), ("", "auto"), ("Pinned", "pinned"),
                                            ("register", "register"), (" auto ", "auto")])
def test_parse_choice(text, expected):
    assert ha.parse_choice(text) == expected


def test_parse_choice_refuses_unknown():
    with pytest.raises(ha.HostAllocatorError, match=ENV_HOST_ALLOCATOR):
        ha.parse_choice("cudaHostAlloc")


@pytest.mark.parametrize("choice, mappable, expected", [
    ("register", False, "register"),
    ("pinned", True, "pinned"),
    ("auto", True, "register"),
    ("auto", None, "register"),     # unknown (no driver): keep the stock path
    ("auto", False, "pinned"),      # WSL2: CanUseHostPointerForRegisteredMem = 0
])
def test_resolve(choice, mappable, expected):
    assert ha.resolve(choice, mappable, GiB) == expected


def test_pinned_buffer_above_4_gib_refused():
    assert ha.resolve("pinned", None, 4 * GiB) == "pinned"
    with pytest.raises(ha.PinnedAllocationTooLarge, match="4 GiB"):
        ha.resolve("pinned", None, 4 * GiB + 1)
    with pytest.raises(ha.PinnedAllocationTooLarge, match="WSL2"):
        ha.resolve("auto", False, 5 * GiB)
    # the stock path has no such limit (chunked registration)
    assert ha.resolve("auto", True, 64 * GiB) == "register"


def test_seed_pools_fit_the_pinned_limit():
    """The reference box's per-rank buffers at ratio 2 (KV 2,580,529,152 B; the mamba
    temporal buffer 33 slots x 48 layers x 24 x 128 x 128 fp32) each fit under 4 GiB."""
    assert ha.resolve("pinned", None, 2_580_529_152) == "pinned"
    assert ha.resolve("pinned", None, 33 * 48 * 24 * 128 * 128 * 4) == "pinned"


def test_choose_reads_environment_and_probes_only_for_auto():
    assert ha.choose(GiB, environ={ENV_HOST_ALLOCATOR: "pinned"}) == "pinned"
    assert ha.choose(GiB, environ={ENV_HOST_ALLOCATOR: "register"}) == "register"


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def test_device_probe_without_driver_is_unknown():
    if _cuda_available():
        pytest.skip("a CUDA device exists here; the probe returns a real answer (GPU test)")
    assert ha.registered_memory_device_mappable() is None


@pytest.mark.gpu
def test_kernel_store_into_each_allocator_choice():
    """A CUDA kernel stores into the memory each choice returns: register (mmap +
    cudaHostRegister, SGLang's stock path) and pinned (this hook's cudaHostAlloc) must take the
    store; pageable memory must not (run in a child process: it can kill the CUDA context)."""
    if not _cuda_available():
        pytest.skip("no CUDA device")
    pytest.importorskip("cupy")
    from tests.runtime import gpu_store_check

    rows = {r["case"]: r for r in gpu_store_check.run_all()}
    assert rows["pinned"]["ok"], rows["pinned"]
    assert rows["register"]["ok"], rows["register"]
    assert not rows["pageable"]["ok"], rows["pageable"]
    auto = rows["auto"]
    assert auto["chosen"] == ("register" if auto["mappable"] else "pinned")
    assert auto["ok"]
