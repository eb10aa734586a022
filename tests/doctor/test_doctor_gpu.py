"""GPU probes on a real CUDA device (the H200 device machine); skipped where none exists.

What these assert is what the platform says about itself: a registered-memory store must
work exactly when ``CanUseHostPointerForRegisteredMem`` is 1, a pageable store exactly when
``PageableMemoryAccess`` is 1. Results seen are in docs/doctor.md.
"""

from __future__ import annotations

import pytest

from escha_deploy.doctor.gpu import gpu_inventory
from escha_deploy.doctor.probes import pick_allocator, run_pinned_ceiling, run_store_case, run_store_probe
from escha_deploy.utils.units import GiB

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("needs_gpu")]


def test_device_and_torch_pinned_take_kernel_stores():
    dev, attrs = run_store_case("device")
    assert dev.ok, dev.error
    pinned, _ = run_store_case("torch_pinned")
    assert pinned.ok, pinned.error  # cudaHostAlloc: device alias == host VA on every platform


def test_registered_and_pageable_follow_the_device_attributes():
    results, attrs = run_store_probe()
    ok = {r.case: r for r in results}
    if "CanUseHostPointerForRegisteredMem" in attrs:
        for flags in range(4):
            r = ok[f"host_register_flags_{flags}"]
            assert r.ok is bool(attrs["CanUseHostPointerForRegisteredMem"]), r.error
    if "PageableMemoryAccess" in attrs:
        assert ok["pageable"].ok is bool(attrs["PageableMemoryAccess"]), ok["pageable"].error
    assert pick_allocator(results) in ("register", "pinned")


@pytest.mark.parametrize("allocator", ["pinned", "register"])
def test_pinned_ladder_reaches_a_small_target(allocator):
    c = run_pinned_ceiling(1 * GiB, allocator=allocator, step_bytes=256 * 2**20, timeout_s=120)
    assert (c.largest_bytes, c.reached, c.timed_out) == (1 * GiB, False, False), c.error


def test_nvml_inventory():
    inv = gpu_inventory()
    assert inv.count >= 1, inv.reasons
    g = inv.gpus[0]
    assert g.memory_total_bytes > 1 * GiB and g.name and inv.driver_version == g.driver_version


def test_doctor_with_a_tp2_profile_on_one_gpu(tmp_path):
    """One GPU cannot run a TP 2 profile: exit 3, while the probes still ran and were saved."""
    from escha_deploy.doctor.run import run_doctor
    from escha_deploy.facts.saved import load_findings

    import torch

    path = tmp_path / "doctor.json"
    report = run_doctor("rtx5060ti-tp2", findings_path=path, reuse=False)
    checks = {c.id: c for c in report.checks}
    assert checks["probe.store"].status in ("ok", "warn")
    if torch.cuda.device_count() < 2:
        assert checks["profile.gpus"].status == "fail" and report.exit_code == 3
    saved = load_findings(path)
    assert saved is not None and saved.host_allocator in ("register", "pinned")
    assert saved.pinned_ceiling_bytes and saved.pinned_ceiling_bytes > 0
