"""Host memory truth: the pinned budget starts from memory the pools can really get.

Each field-report row is a test whose expected value is the right outcome. The hosts are
/proc and cgroup fixture trees (tests/planner/fixtures/) read through the product's own
readers (``host.gather_host_facts(root=...)``); expected numbers are derived here from the
fixture's figures and the stated safety policy (memory base - ranks x 3 GiB - 1 GiB - 2 GiB),
not copied from the planner's output.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from escha_deploy.doctor.checks import check_memlock, check_memory
from escha_deploy.doctor.facts import gather_facts
from escha_deploy.facts.gpus import GpuInventory
from escha_deploy.doctor.hostinfo import DockerFacts
from escha_deploy.facts.saved import DoctorFindings, save_findings
from escha_deploy.facts.machine import described_host, gather_host_facts, host_id, hugetlb_bytes, read_meminfo
from escha_deploy.planner import plan
from escha_deploy.planner.pools import host_pools_at_ratio
from escha_deploy.profile import load_profile
from escha_deploy.utils.units import GB, GiB, MiB

FIX = Path(__file__).parent / "fixtures"
POLICY = 3 * GiB, 1 * GiB, 2 * GiB  # per rank, OS, page-cache floor (profiles' safety: defaults)


def reserves(ranks: int) -> int:
    return ranks * POLICY[0] + POLICY[1] + POLICY[2]


def live(tree: str, platform=None):
    return gather_host_facts(root=FIX / tree, platform=platform, use_findings=False)


# --- B03: hugepages ---------------------------------------------------------------------------


def test_b03_hugepages_are_not_in_the_budget():
    """MemTotal 32 GiB with 6144 x 2 MiB huge pages: 12 GiB the pools can never get.
    Before: the budget counted them and the plan took the 4.0 cap. After: base 20 GiB."""
    host = live("hugepages-32g", "linux")
    assert host.hugetlb_bytes == 6144 * 2 * MiB == 12 * GiB
    prof = load_profile("rtx5060ti-tp2")
    p = plan(prof, host)
    assert p.budget.memory_base_bytes == 20 * GiB
    assert p.budget.pinned_budget_bytes == 20 * GiB - reserves(2)
    assert "huge pages" in p.budget.memory_base_source and "/proc/meminfo" in p.budget.memory_base_source
    # the old answer (ratio 4, counting the huge pages) no longer fits
    at4 = 2 * host_pools_at_ratio(p_dev(p), 4.0).pinned_bytes
    assert at4 > 20 * GiB - reserves(2)
    assert p.verdict == "ok" and p.hicache.ratio < 4.0
    assert p.pinned_total_bytes + 64 * MiB <= 20 * GiB - reserves(2)
    assert "huge pages" in p.reasons[0]  # the binding constraint, named with its source
    assert p.budget.binding == "ram"


def p_dev(p):
    """The plan's device pools, rebuilt from its per-rank figures (for host_pools_at_ratio)."""
    from escha_deploy.planner.pools import DevicePools
    r = p.per_rank
    return DevicePools(kv_tokens=r.device_kv_tokens, kv_bytes=r.device_kv_bytes, kv_page_size=p.page_size,
                       mamba_slots=r.device_mamba_slots, mamba_bytes=r.device_mamba_bytes,
                       mamba_bytes_per_slot=r.mamba_bytes_per_slot,
                       host_kv_bytes_per_token=r.host_kv_bytes_per_token or r.device_kv_bytes_per_token)


def test_b03_doctor_hugepages_row_shows_12_gib_and_what_it_does():
    f = gather_facts(FIX / "hugepages-32g", {}, docker=lambda: DockerFacts(reachable=False, error="none"),
                     gpus=lambda: GpuInventory(source="none", reasons=["no NVML in this test"]))
    row = {c.id: c for c in check_memory(f)}["host.hugepages"]
    assert row.status == "warn"
    assert "12.00 GiB" in row.detail and "6144 x 2 MiB" in row.detail
    assert "subtracts it from MemTotal" in row.detail


def test_hugetlb_of_other_page_sizes_counts():
    """1 GiB pages reserved at boot show in ``Hugetlb`` (all sizes), not in HugePages_Total
    (the default 2 MiB size only)."""
    mem = {"HugePages_Total": 0, "Hugepagesize": 2 * MiB, "Hugetlb": 8 * GiB}
    assert hugetlb_bytes(mem) == 8 * GiB
    assert hugetlb_bytes({"HugePages_Total": 10, "Hugepagesize": 2 * MiB}) == 20 * MiB  # kernels before 4.16
    assert hugetlb_bytes(read_meminfo(FIX / "hugepages-32g")) == 12 * GiB


# --- cgroup limits, v1 and v2 -----------------------------------------------------------------


@pytest.mark.parametrize("tree,limit,file", [
    ("cgroup-v2-12g", 12 * GiB, "/sys/fs/cgroup/memory.max"),
    ("cgroup-v1-16g", 16 * GiB, "/sys/fs/cgroup/memory/memory.limit_in_bytes"),
])
def test_cgroup_limit_is_the_base_and_named(tree, limit, file):
    host = live(tree, "linux")
    assert host.in_container and host.cgroup_limit_bytes == limit
    p = plan(load_profile("rtx5060ti-tp2-fp8"), host)
    assert p.budget.memory_base_bytes == limit
    assert p.budget.pinned_budget_bytes == limit - reserves(2)
    assert p.budget.binding == "cgroup" and file in p.budget.memory_base_source
    assert file in p.budget.binding_detail
    if p.hicache.enabled:
        assert p.pinned_total_bytes + 64 * MiB <= limit - reserves(2)
        assert file in p.reasons[0]
    else:
        assert file in p.reasons[0] and "cgroup budget" in p.reasons[0]


def test_cgroup_v1_unlimited_is_no_limit():
    host = live("cgroup-v1-unlimited", "linux")
    assert host.cgroup_limit_bytes is None
    assert plan(load_profile("rtx5060ti-tp2-fp8"), host).budget.memory_base_bytes == 64 * GiB


def test_cgroup_smaller_than_the_reserves_is_unsafe_naming_the_limit():
    host = live("cgroup-v2-12g", "linux").model_copy(update={"cgroup_limit_bytes": 8 * GiB})
    p = plan(load_profile("rtx5060ti-tp2-fp8"), host)
    assert p.verdict == "unsafe"
    assert any("exceed the memory the server can have" in r and "memory.max" in r
               and "raise the container's memory limit" in r for r in p.reasons)


# --- B08/B09: the WSL2 pinned ceiling ------------------------------------------------------------


def _wsl2_with_ceiling(tmp_path, monkeypatch, ceiling: int):
    """The 16 GiB WSL2 fixture with doctor findings saved for it (a measured, reached ceiling),
    read back by ``gather_host_facts`` as ``plan`` does."""
    root = FIX / "wsl2-16g"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    save_findings(DoctorFindings(created_at=dt.datetime.now(dt.timezone.utc).isoformat(), host_id=host_id(root),
                                 platform="wsl2", pinned_ceiling_bytes=ceiling, pinned_ceiling_reached=True),
                  tmp_path / "escha-deploy" / "doctor.json")
    host = gather_host_facts(root=root)
    assert (host.platform, host.pinned_ceiling_bytes) == ("wsl2", ceiling)
    return host


def test_b08_reason_names_the_measured_ceiling_not_the_ram_budget(tmp_path, monkeypatch):
    """1 GB ceiling on a 16 GiB WSL2 VM. Before: 'no ratio fits the pinned budget 7.52 GB'.
    After: the ceiling, its number and source, and that memlock does not lift it."""
    host = _wsl2_with_ceiling(tmp_path, monkeypatch, 1 * GB)
    p = plan(load_profile("rtx5060ti-tp2"), host)
    assert p.verdict == "hicache_off" and p.budget.binding == "ceiling"
    why = p.reasons[0]
    assert "the pinned ceiling" in why and "1.00 GB" in why and "escha-deploy doctor" in why
    assert "7.52 GB" not in why  # the RAM budget does not bind
    assert "memlock=-1 does not lift it" in why


def test_b08_headroom_applies_against_the_ceiling(tmp_path, monkeypatch):
    """3 GB ceiling: before, the recommended ratio left 53.7 MB under it; after, >= 64 MiB."""
    host = _wsl2_with_ceiling(tmp_path, monkeypatch, 3 * GB)
    prof = load_profile("rtx5060ti-tp2")
    p = plan(prof, host)
    assert p.verdict == "ok" and p.budget.binding == "ceiling"
    assert 3 * GB - p.per_rank.pinned_bytes >= 64 * MiB
    assert p.budget.headroom_bytes == 3 * GB - p.per_rank.pinned_bytes
    nxt = host_pools_at_ratio(p_dev(p), round(p.hicache.ratio + 0.05, 6)).pinned_bytes
    assert 3 * GB - nxt < 64 * MiB  # the next step would break the headroom: it is the largest
    assert "pinned ceiling" in p.reasons[0] and "3.00 GB" in p.reasons[0]
    assert any("memlock=-1 does not lift it" in r for r in p.reasons)


def test_b09_doctor_memlock_advice_on_wsl2_says_it_does_not_lift_the_ceiling():
    """The WSL2 container fixture has memlock 64 KiB: the fix still says memlock=-1 (SGLang's
    compose sets it) but that it does not lift the WSL2 pinned ceiling."""
    root = Path(__file__).parents[1] / "doctor" / "fixtures" / "wsl2-desktop-container"
    f = gather_facts(root, {}, docker=lambda: DockerFacts(reachable=False, error="none"),
                     gpus=lambda: GpuInventory(source="none", reasons=["no NVML in this test"]))
    c = check_memlock(f)
    assert c.status == "warn" and "memlock=-1" in c.fix and "does not lift the pinned ceiling" in c.fix


# --- V01: a VM too small for the server processes -------------------------------------------------


@pytest.mark.parametrize("gib", [4, 8])
def test_v01_vm_smaller_than_the_reserves_is_unsafe(gib):
    """Before: hicache_off, 'launchable without it', exit 0. After: unsafe, naming the reserves."""
    assert reserves(2) > gib * GiB
    p = plan(load_profile("rtx5060ti-tp2-fp8"), described_host(gib * GiB, "wsl2"))
    assert p.verdict == "unsafe"
    r = next(r for r in p.reasons if "reserves" in r)
    # one unit in the sum (GiB, as the policy's terms), its GB figure after it; the base as read
    assert f"= {reserves(2) / GiB:.2f} GiB ({reserves(2) / 1e9:.2f} GB))" in r
    assert f"can have, MemTotal {gib:.2f} GiB (--host-ram)" in r
    assert ".wslconfig" in r and "memory=" in r
    assert not any("launchable" in x for x in p.reasons)


def test_v01_cli_exit_3(cli):
    r = cli("plan", "-p", "rtx5060ti-tp2-fp8", "--host-ram", "4GiB", "--wsl2", "-f", "json")
    assert r.code == 3 and json.loads(r.out)["verdict"] == "unsafe"


# --- V02: the true largest safe ratio and the cap --------------------------------------------------


def test_v02_max_safe_ratio_is_not_the_cap():
    """64 GiB Linux: before, 'largest safe 4.0' while --ratio 8 planned ok. After: the largest
    ratio that fits, and the cap reported apart."""
    prof = load_profile("rtx5060ti-tp2")
    host = described_host(64 * GiB, "linux")
    p = plan(prof, host)
    assert (p.ratio_cap, p.recommended_ratio) == (prof.hicache.max_ratio, 4.0)
    budget = 64 * GiB - reserves(2)
    dev = p_dev(p)
    assert 2 * host_pools_at_ratio(dev, p.max_safe_ratio).pinned_bytes <= budget
    assert 2 * host_pools_at_ratio(dev, round(p.max_safe_ratio + 0.001, 3)).pinned_bytes > budget
    assert p.max_safe_ratio > 8
    assert plan(prof, host, ratio=8).verdict == "ok"
    assert plan(prof, host, ratio=p.max_safe_ratio).verdict == "ok"
    over = plan(prof, host, ratio=round(p.max_safe_ratio + 0.001, 3))
    assert over.verdict == "unsafe" and any(f"use a ratio <= {p.max_safe_ratio}" in r for r in over.reasons)


def test_v02_ratio_cap_in_json(cli):
    d = json.loads(cli("plan", "-p", "rtx5060ti-tp2", "--host-ram", "64GiB", "--linux", "-f", "json").out)
    assert d["ratio_cap"] == 4.0 and d["max_safe_ratio"] > 8 and d["recommended_ratio"] == 4.0


def test_wsl2_ram_budget_binding_gives_wslconfig_advice():
    """The seed's 16 GiB VM: the RAM budget binds (1.45 < the 4.0 cap), so the reasons say how
    to give the VM more memory."""
    p = plan(load_profile("rtx5060ti-tp2"), described_host(16 * GiB, "wsl2"))
    assert p.verdict == "ok" and p.recommended_ratio == 1.45 and p.budget.binding == "ram"
    assert any(".wslconfig" in r and "wsl --shutdown" in r for r in p.reasons)
    # off WSL2 the same numbers give no WSL2 advice
    assert not any(".wslconfig" in r for r in plan(load_profile("rtx5060ti-tp2"), described_host(16 * GiB)).reasons)


# --- B25/B26: stock runtime, hybrid model, HiCache ---------------------------------------------------


def test_b25_stock_runtime_hybrid_hicache_warns_and_offers_the_canary(cli):
    """Before: ok, HiCache at 4.0, silent. After: a warning naming both upstream failures and
    `up --canary`."""
    r = cli("plan", "-p", "rtx5060ti-tp2-fp8", "--host-ram", "64GiB", "--linux", "--set", "runtime.needs=[]",
            "-f", "json")
    d = json.loads(r.out)
    assert r.code == 0 and d["hicache"]["enabled"] and d["hybrid"]
    w = [x for x in d["warnings"] if "up --canary" in x]
    assert len(w) == 1 and "stock SGLang 0.5.19" in w[0] and "sglang#39830" in w[0]
    # 0.5.19, extra_buffer (auto, overlap on), page 1, write_through: a real server loaded back
    assert "sglang#33713" not in w[0] and "may be inert" not in w[0]


@pytest.mark.parametrize("sets,says", [
    (["hicache.hicache_write_policy=write_back"], "under write_back a new branching state reaches the host only"),
    (["runtime.mamba_radix_cache_strategy=no_buffer"], "no_buffer keeps a mamba state only at the end of each request"),
    (["runtime.extra_args=[--disable-overlap-schedule]"], "no_buffer (auto, with the overlap scheduler off)"),
    (["runtime.page_size=8", "runtime.mamba_radix_cache_strategy=extra_buffer"], "page size 8 was not tried"),
    (["runtime.speculative.algorithm=NEXTN"], "speculative decoding (NEXTN) with a hybrid host tier"),
])
def test_the_inert_warning_names_the_configuration_it_applies_to(sets, says):
    prof = load_profile("rtx5060ti-tp2-fp8", ["runtime.needs=[]", *sets])
    w = [x for x in plan(prof, described_host(64 * GiB)).warnings if "up --canary" in x]
    assert len(w) == 1 and "may be inert (sglang#33713: " in w[0] and says in w[0] and "sglang#39830" in w[0]


def test_the_inert_reasons_by_configuration():
    from escha_deploy.planner import hybrid_host_hits_inert

    assert hybrid_host_hits_inert("0.5.19", "auto", 1, "write_through", []) == []
    assert hybrid_host_hits_inert("0.5.19", "extra_buffer", 1, "write_through", []) == []
    assert hybrid_host_hits_inert("0.5.23", "auto", 1, "write_through", []) == [
        "SGLang 0.5.23 was not tried on a real server"]
    assert len(hybrid_host_hits_inert("0.5.19", "no_buffer", 1, "write_back", [])) == 2
    assert hybrid_host_hits_inert("0.5.19", "auto", 1, "write_through", [], "EAGLE3") == [
        "speculative decoding (EAGLE3) with a hybrid host tier was not tried on a real server"]


def test_b25_no_restore_warning_without_a_host_tier_or_a_hybrid_model():
    prof = load_profile("rtx5060ti-tp2-fp8", ["runtime.needs=[]", "hicache.enabled=false"])
    assert not any("up --canary" in w for w in plan(prof, described_host(64 * GiB)).warnings)
    dense = load_profile("linux-tp2-l3", ["runtime.needs=[]", "model.architecture.full_attention_interval=null",
                                          "runtime.max_mamba_cache_size=null"])
    p = plan(dense, described_host(256 * GiB))
    assert not p.hybrid and p.hicache.enabled
    assert not any("up --canary" in w for w in p.warnings)


# --- the OOM-kill count diagnose needs to say "OOM killer" --------------------------------------------


def test_oom_kill_count_from_cgroup_v2_and_v1():
    from escha_deploy.facts.machine import read_oom_kill_count

    assert read_oom_kill_count(FIX / "cgroup-v2-12g") == 2  # memory.events
    assert read_oom_kill_count(FIX / "cgroup-v1-16g") == 1  # memory.oom_control
    assert read_oom_kill_count(FIX / "hugepages-32g") is None
    live_count = read_oom_kill_count()
    assert live_count is None or live_count >= 0
