"""The checks as tables: facts in (read from the fixture trees and recorded ``docker info``),
status and fix out. The GPU inventories here are recorded values (stand-ins for NVML, which
cannot run on this GPU-less machine); the GPU tests read the real one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from escha_deploy.doctor.checks import ProfileNeeds, host_checks, profile_checks
from escha_deploy.doctor.facts import DoctorFacts, ProbeFacts, gather_facts
from escha_deploy.facts.gpus import GpuInventory, GpuRecord
from escha_deploy.doctor.hostinfo import DockerFacts, classify_docker_info
from escha_deploy.doctor.probes import PinnedCeiling
from escha_deploy.doctor.report import DoctorReport
from escha_deploy.facts.saved import StoreProbeResult
from escha_deploy.utils.units import GB, GiB

FIXTURES = Path(__file__).parent / "fixtures"
NO_GPU = GpuInventory(source="none", reasons=["NVML: nvidia-ml-py not installed", "nvidia-smi: not found"])
TWO_5060 = GpuInventory(source="nvml", driver_version="596.49", nccl_version="2.28.3", gpus=[
    GpuRecord(index=i, name="NVIDIA GeForce RTX 5060 Ti", memory_total_bytes=16303 * 2**20, compute_capability="12.0",
              p2p={str(1 - i): "not supported"})
    for i in range(2)])
UNREACHABLE = DockerFacts(reachable=False, error="Error while fetching server API version")
NEED = ProfileNeeds(name="rtx5060ti-tp2", gpu_count=2, gpu_vram_bytes=12 * GiB, gpu_name="GeForce RTX 5060 Ti",
                    tp_size=2, hicache_enabled=True, pinned_per_rank_bytes=2_598_813_696)


def _docker(name: str) -> DockerFacts:
    return classify_docker_info(json.loads((FIXTURES / "docker_info" / f"{name}.json").read_text()))


def facts(tree: str, docker: DockerFacts = UNREACHABLE, gpus: GpuInventory = NO_GPU, environ=None) -> DoctorFacts:
    return gather_facts(FIXTURES / tree, environ or {}, docker=lambda: docker, gpus=lambda: gpus)


def by_id(checks):
    return {c.id: c for c in checks}


def test_wsl2_desktop_container_rows():
    f = facts("wsl2-desktop-container", docker=_docker("docker-desktop-wsl2"))
    c = by_id(host_checks(f))
    assert c["platform"].status == "ok"
    assert "WSL2 (5.15.167.4-microsoft-standard-WSL2), in a container" in c["platform"].detail
    assert "Docker Desktop" in c["platform"].detail
    assert c["host.memlock"].status == "warn" and "memlock=-1" in c["host.memlock"].fix
    assert "does not lift the pinned ceiling" in c["host.memlock"].fix  # WSL2: memlock is not the ceiling
    assert c["host.shm"].status == "warn" and "--ipc=host" in c["host.shm"].fix
    assert c["host.swap"].status == "warn"  # 1 GiB of swap in use
    assert "cgroup limit 12.00 GiB" in c["host.memory"].detail
    assert c["docker.gpu"].status == "ok"
    assert c["gpu.inventory"].status == "warn" and "no GPU: NVML" in c["gpu.inventory"].detail


def test_wsl2_distro_engine_rows():
    f = facts("wsl2-distro-engine", docker=_docker("engine-wsl2-distro"))
    c = by_id(host_checks(f))
    assert "Docker engine in the distro" in c["platform"].detail
    assert c["host.hugepages"].status == "warn" and "2.00 GiB" in c["host.hugepages"].detail
    assert c["host.page_cache"].status == "warn"  # 1.43 GiB < the 2 GiB floor
    assert c["host.memlock"].status == "ok" and "does not lift" in c["host.memlock"].detail
    assert c["docker.gpu"].detail.endswith("cdi:nvidia.com/gpu=all")


def test_wsl2_without_dxg_warns():
    f = facts("wsl2-distro-desktop")
    c = by_id(host_checks(f))
    assert c["platform"].status == "warn" and "wsl --update" in c["platform"].fix


def test_docker_unreachable_fixes_differ_by_platform():
    wsl = by_id(host_checks(facts("wsl2-distro-engine")))["docker.daemon"]
    assert wsl.status == "warn" and "WSL integration" in wsl.fix
    desk = by_id(host_checks(facts("wsl2-distro-desktop")))["docker.daemon"]
    assert "systemctl" in desk.fix  # the integration socket exists: the daemon itself is down
    inside = by_id(host_checks(facts("wsl2-desktop-container")))["docker.daemon"]
    # inside a container: a warning that says `up` needs a daemon and `serve` does not
    assert inside.status == "warn" and "`serve` needs none" in inside.fix


def test_docker_without_gpu_runtime():
    c = by_id(host_checks(facts("linux-host", docker=_docker("docker-desktop-linuxkit"))))
    assert c["docker.gpu"].status == "warn" and "Docker Desktop" in c["docker.gpu"].fix


def test_no_gpu_fails_every_profile_with_the_reasons():
    rows = by_id(profile_checks(facts("linux-host"), NEED))
    assert rows["profile.gpus"].status == "fail" and rows["profile.gpus"].profile
    assert "no GPU: NVML: nvidia-ml-py not installed; nvidia-smi: not found" in rows["profile.gpus"].detail


def _probed(tree: str, store_ok: dict[str, bool], pinned: PinnedCeiling | None, nccl=None, gpus=TWO_5060):
    from escha_deploy.doctor.probes import pick_allocator

    store = [StoreProbeResult(case=k, ok=v, error=None if v else "illegal memory access") for k, v in store_ok.items()]
    f = facts(tree, gpus=gpus)
    f.probes = ProbeFacts(source="ran now", store=store, host_allocator=pick_allocator(store), pinned=pinned,
                          nccl=nccl or [], device_attributes={"CanUseHostPointerForRegisteredMem": 0})
    return f


WSL_STORE = {"device": True, "torch_pinned": True, "host_register_flags_0": False, "pageable": False}


def test_wsl2_store_probe_picks_pinned_and_the_ceiling_warns():
    ceiling = PinnedCeiling(allocator="pinned", target_bytes=2_598_813_696, step_bytes=256 * 2**20,
                            largest_bytes=512 * 2**20, reached=True, error="RuntimeError: CUDA error: out of memory")
    ok_nccl = [{"ok": True, "world_size": 2, "seconds": 1.2, "env": {"NCCL_P2P_DISABLE": "1"}}]
    f = _probed("wsl2-distro-engine", WSL_STORE, ceiling, ok_nccl)
    c = by_id(host_checks(f))
    assert c["probe.store"].status == "warn" and "ESCHA_HICACHE_HOST_ALLOCATOR=pinned" in c["probe.store"].fix
    assert "CanUseHostPointerForRegisteredMem=0" in c["probe.store"].detail
    assert c["probe.pinned"].status == "warn" and "0.54 GB" in c["probe.pinned"].detail
    assert c["probe.nccl"].status == "ok" and "NCCL_P2P_DISABLE=1" in c["probe.nccl"].detail
    rows = by_id(profile_checks(f, NEED))
    assert [r.status for r in rows.values()] == ["ok", "ok", "ok", "warn", "ok", "ok", "ok"]  # + gpu.compat.0, .1
    assert rows["profile.host_allocator"].detail.endswith("via pinned")
    report = DoctorReport(created_at="2026-11-29T00:00:00+00:00", host_id="x", profile=NEED.name,
                          checks=host_checks(f) + profile_checks(f, NEED))
    assert report.exit_code == 0  # a ceiling shrinks HiCache, it does not stop the profile


def test_no_host_memory_for_kernels_fails_hicache_profiles():
    f = _probed("linux-host", {"device": True, "torch_pinned": False, "host_register_flags_0": False}, None)
    assert by_id(host_checks(f))["probe.store"].status == "fail"
    assert by_id(profile_checks(f, NEED))["profile.host_allocator"].status == "fail"
    no_hicache = ProfileNeeds(**{**NEED.__dict__, "hicache_enabled": False})
    assert "profile.host_allocator" not in by_id(profile_checks(f, no_hicache))


def test_nccl_failure_fails_the_profile():
    bad = [{"ok": False, "world_size": 2, "seconds": 90, "env": {"NCCL_P2P_DISABLE": "1"},
            "error": "all-reduce did not finish within 60 s (ranks killed)"}]
    f = _probed("linux-host", {"host_register_flags_0": True}, None, bad)
    assert by_id(host_checks(f))["probe.nccl"].status == "fail"
    assert by_id(profile_checks(f, NEED))["profile.nccl"].status == "fail"


@pytest.mark.parametrize("vram, status", [(16303 * 2**20, "ok"), (int(11.9 * GiB), "ok"), (8 * GiB, "fail")])
def test_vram_against_profile(vram, status):
    gpus = GpuInventory(source="nvml", gpus=[GpuRecord(index=i, name="NVIDIA GeForce RTX 5060 Ti", memory_total_bytes=vram)
                                             for i in range(2)])
    assert by_id(profile_checks(facts("linux-host", gpus=gpus), NEED))["profile.vram"].status == status


def test_one_gpu_for_tp2_fails():
    gpus = GpuInventory(source="nvml", gpus=[GpuRecord(index=0, name="NVIDIA H200", memory_total_bytes=143771 * 2**20)])
    rows = by_id(profile_checks(facts("linux-host", gpus=gpus), NEED))
    assert rows["profile.gpus"].status == "fail" and "found 1" in rows["profile.gpus"].detail
    assert "profile.nccl" not in rows


def test_pinned_fits_and_unmeasured():
    fits = PinnedCeiling(allocator="register", target_bytes=3 * GB, step_bytes=256 * 2**20, largest_bytes=3 * GB,
                         reached=False)
    f = _probed("linux-host", {"host_register_flags_0": True}, fits)
    assert by_id(profile_checks(f, NEED))["profile.pinned"].status == "ok"
    short = fits.model_copy(update={"largest_bytes": 1 * GB})  # capped by MemAvailable, no failure
    f = _probed("linux-host", {"host_register_flags_0": True}, short)
    row = by_id(profile_checks(f, NEED))["profile.pinned"]
    assert row.status == "warn" and "only 1.00 GB was tried" in row.detail


def test_plan_problems_become_failures():
    need = ProfileNeeds(**{**NEED.__dict__, "plan_problems": ("hicache: pinned 10.24 GB exceeds the budget",)})
    rows = profile_checks(facts("linux-host", gpus=TWO_5060), need)
    assert [r.status for r in rows if r.id == "profile.plan"] == ["fail"]


def test_every_non_ok_check_has_a_one_line_fix():
    for tree in ("wsl2-desktop-container", "wsl2-distro-engine", "wsl2-distro-desktop", "linux-host"):
        for c in host_checks(facts(tree)) + profile_checks(facts(tree), NEED):
            assert c.status == "ok" or (c.fix and "\n" not in c.fix)


def test_page_cache_floor_is_the_profiles_safety_policy(tmp_path):
    """doctor --profile judges the page cache against that profile's safety.page_cache_floor,
    not a constant: 3.72 GiB of page cache passes the default 2 GiB floor, warns under 6 GiB."""
    from escha_deploy.doctor.run import build_report, needs_from_profile

    f = facts("wsl2-desktop-container", docker=_docker("docker-desktop-wsl2"))
    assert by_id(host_checks(f))["host.page_cache"].status == "ok"
    prof = tmp_path / "big-floor.yaml"
    prof.write_text("extends: rtx5060ti-tp2-fp8\nname: big-floor\nsafety:\n  page_cache_floor: 6GiB\n")
    need = needs_from_profile(str(prof))
    assert need.page_cache_floor_bytes == 6 * GiB and need.ref == str(prof)
    import datetime as dt

    report = build_report(f, need, dt.datetime.now(dt.timezone.utc))
    row = by_id(report.checks)["host.page_cache"]
    assert row.status == "warn" and "6.00 GiB floor (safety.page_cache_floor)" in row.detail
    # hints name the profile as the user gave it, so they run as printed
    import dataclasses

    rows = profile_checks(f, dataclasses.replace(need, plan_problems=("plan: unsafe",)))
    assert by_id(rows)["profile.plan"].fix == f"`escha-deploy plan --profile {prof}` explains the budget"


@pytest.mark.parametrize("reachable", [False, True])
def test_the_memlock_probe_that_did_not_run_names_the_missing_step(reachable):
    """The daemon's memlock probe needs the daemon first, then an image on it: with no daemon
    the fix points at docker.daemon's row (not at building an image it could not run); with a
    daemon and no image, at the build."""
    from escha_deploy.doctor.checks import check_daemon_memlock
    from escha_deploy.doctor.hostinfo import MemlockProbe

    docker = _docker("docker-desktop-wsl2") if reachable else UNREACHABLE
    why = "no image to run it from: x:1 not on this daemon" if reachable else "Error while fetching server API version"
    f = facts("linux-host", docker=docker).model_copy(update={"memlock_probe": MemlockProbe(not_run=why)})
    (row,) = check_daemon_memlock(f)
    assert row.status == "warn" and row.detail == f"not run: {why}"
    if reachable:
        assert "escha-deploy build --hicache" in row.fix and "docker.daemon" not in row.fix
    else:
        assert "docker.daemon" in row.fix and "build" not in row.fix
